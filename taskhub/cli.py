"""The `taskhub` command: `taskhub demo` runs everything in one process, `taskhub test` runs the tests."""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEMO_SERVER_READY_PREFIX = "taskhub-demo listening on "
# Set for the second test pass: tests/conftest.py then keeps only the tests marked `embedded`.
EMBEDDED_PASS_ENV = "TASKHUB_EMBEDDED_PASS"
PYTEST_OK, PYTEST_TESTS_FAILED, PYTEST_NO_TESTS_COLLECTED = 0, 1, 5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="taskhub", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run taskhub on this machine: database, migrations, web server")
    demo.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    demo.add_argument("--no-demo-server", action="store_true", help="do not start the bundled demo MCP server")
    demo.add_argument("--demo-server-port", type=int, default=0, help="port of the demo MCP server (default: any)")
    demo.add_argument("--access-log", action="store_true", help="print one line per HTTP request")
    demo.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the embedded Postgres and the demo server keep their data (default: var/ in the checkout)",
    )

    manage = commands.add_parser(
        "manage",
        help="a manage.py command with the settings `taskhub demo` uses (e.g. `taskhub manage create_api_token olga`)",
        description="Runs a manage.py command as `taskhub demo` runs taskhub: DEBUG on unless set, and (without"
        " DATABASE_URL) the demo's embedded Postgres, joined if it runs and started for the command if not. For a"
        " production deployment, run `python manage.py` with its own environment instead.",
    )
    manage.add_argument("--data-dir", type=Path, default=None, help="the --data-dir the demo was given, if any")
    manage.add_argument("arguments", nargs=argparse.REMAINDER, help="the manage.py command and its arguments")

    commands.add_parser(
        "test",
        help="run the tests (with DATABASE_URL set, the tests marked `embedded` run again on embedded Postgres)",
        description="Extra arguments go to pytest, e.g. `taskhub test -x -k healthz`.",
    )

    health = commands.add_parser(
        "healthcheck",
        help="exit 0 if this container's web process or worker is healthy, else 1 (the image's HEALTHCHECK)",
        description="web: GET TASKHUB_HEALTHCHECK_URL (default http://127.0.0.1:8000/healthz) answers 200, whatever"
        " ALLOWED_HOSTS says. worker: the worker touched TASKHUB_WORKER_HEALTH_FILE within three beats"
        " (TASKHUB_WORKER_HEALTH_SECONDS). Without a role: worker if that file exists, else web.",
    )
    health.add_argument("role", nargs="?", choices=["web", "worker"], help="what to check (default: see above)")

    pg = commands.add_parser("pg", help="the embedded Postgres in var/pgdata (or TASKHUB_PGDATA)")
    pg.add_argument("action", choices=["status", "stop"])

    # Everything `taskhub test` does not know is for pytest, options included.
    args, pytest_args = parser.parse_known_args(argv)
    if args.command == "test":
        return run_tests(pytest_args)
    if pytest_args:
        parser.error(f"unrecognized arguments: {' '.join(pytest_args)}")
    if args.command == "demo":
        return run_demo(args)
    if args.command == "healthcheck":
        return run_healthcheck(args.role)
    if args.command == "manage":
        return run_manage(args.data_dir, args.arguments)
    return run_pg(args.action)


def say(message: str) -> None:
    print(message, flush=True)


# --- taskhub demo -----------------------------------------------------------------------------------------------


def run_demo(args: argparse.Namespace) -> int:
    # The reactor must be daphne's asyncio one, installed before anything imports twisted.internet.reactor.
    import daphne.server  # noqa: F401

    # Started from a script in the background, a process may inherit SIGINT as ignored, and neither Python
    # nor Twisted then installs a handler: Ctrl-C must always stop the demo.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    data_dir = use_demo_settings(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    # The links in notification mails lead to this server.
    link_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    link_host = f"[{link_host}]" if ":" in link_host else link_host
    os.environ.setdefault("TASKHUB_BASE_URL", f"http://{link_host}:{args.port}")
    metrics_access = demo_metrics_access(os.environ)

    # The web port is held from now on (daphne adopts this very socket), so nothing started before daphne
    # listens, such as the demo MCP server on a port the system picks, can take it.
    web_socket = hold_port(args.host, args.port)
    if web_socket is None:
        say(f"Port {args.port} on {args.host} is already in use. Stop what uses it, or pick another: --port 8001")
        return 2

    demo_server = None
    worker = None
    embedded = not os.environ.get("DATABASE_URL")
    try:
        start_database(embedded)
        prepare_database()
        if args.no_demo_server:
            say("• Demo MCP server: skipped (--no-demo-server)")
        else:
            demo_server, demo_url = start_demo_server(args.demo_server_port, data_dir)
            if demo_url:
                register_demo_server(demo_url)
        say(f"• Metrics: http://{link_host}:{args.port}/metrics ({metrics_access})")
        worker = InProcessWorker()
        worker.start()
        serve(web_socket, args.host, args.port, access_log=args.access_log)
    except KeyboardInterrupt:
        say("\nInterrupted.")
    finally:
        web_socket.close()  # a no-op once daphne has adopted it
        say("Stopping…")
        if worker is not None:
            worker.stop()
        if demo_server is not None:
            stop_process(demo_server, "demo MCP server")
        if embedded:
            stop_embedded_database()
        say("Stopped.")
    return 0


DEMO_METRICS_NETWORKS = "127.0.0.1/32,::1/128"


def demo_metrics_access(environ) -> str:
    """/metrics in the demo (issue 34, item 9): readable from the demo's own machine (loopback) without a restart or
    a variable, as a person trying taskhub expects; unless TASKHUB_METRICS_TOKEN or TASKHUB_METRICS_ALLOWED_NETWORKS
    say otherwise. Only `taskhub demo` does this: a deployment (manage.py, daphne) still refuses /metrics to everyone
    until one of them is set. Returns how the banner words it."""
    if environ.get("TASKHUB_METRICS_TOKEN", "").strip() or environ.get("TASKHUB_METRICS_ALLOWED_NETWORKS", "").strip():
        return "as TASKHUB_METRICS_TOKEN / TASKHUB_METRICS_ALLOWED_NETWORKS say"
    environ["TASKHUB_METRICS_ALLOWED_NETWORKS"] = DEMO_METRICS_NETWORKS
    return "from this machine only; set TASKHUB_METRICS_TOKEN to scrape it from elsewhere"


def use_demo_settings(data_dir: Path | None) -> Path:
    """The environment `taskhub demo` and `taskhub manage` share; returns the demo's data directory."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskhub.settings")
    if "DEBUG" not in os.environ:
        os.environ["DEBUG"] = "true"  # a local demo: development secret key, static files straight from static/
    # Notification mails print to the console (a worker's), unless an SMTP server is configured.
    if "EMAIL_HOST" not in os.environ:
        os.environ.setdefault("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
    resolved = (data_dir or PROJECT_DIR / "var").resolve()
    if data_dir is not None or "TASKHUB_PGDATA" not in os.environ:
        os.environ["TASKHUB_PGDATA"] = str(resolved / "pgdata")
    return resolved


def hold_port(host: str, port: int) -> socket.socket | None:
    """A socket listening on host:port for daphne to adopt, or None when the port is taken."""
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
        listening.listen(128)
    except OSError:
        listening.close()
        return None
    return listening


def start_database(embedded: bool) -> None:
    if not embedded:
        import dj_database_url

        config = dj_database_url.parse(os.environ["DATABASE_URL"])
        say(f"• Database: {config.get('NAME')} on {config.get('HOST') or 'local socket'} (DATABASE_URL)")
        return
    from taskhub import embedded_pg

    say(f"• Starting embedded Postgres in {embedded_pg.data_dir()} …")
    started = time.monotonic()
    server = embedded_pg.ensure_started()
    say(f"  ready in {time.monotonic() - started:.1f} s (pid {server.pid}, socket in {server.socket_dir})")


def prepare_database() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    say("• Applying database migrations …")
    call_command("migrate", interactive=False, verbosity=0)
    say("  done")
    ensure_demo_users()


# username -> the groups that make its role; the admin is a superuser too, and an approver so one login shows it all.
DEMO_USERS = {"admin": ("admins", "operators", "approvers"), "operator": ("operators",), "approver": ("approvers",)}


def ensure_demo_users() -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    users = get_user_model()
    for username, group_names in DEMO_USERS.items():
        if users.objects.filter(username=username).exists():
            say(f"• User '{username}' exists (new password: uv run taskhub manage changepassword {username})")
            continue
        password = secrets.token_urlsafe(12)
        email = f"{username}@example.com"  # so that the demo's notification mails show on its console
        if username == "admin":
            user = users.objects.create_superuser(username=username, email=email, password=password)
        else:
            user = users.objects.create_user(username=username, email=email, password=password)
        user.groups.set(Group.objects.filter(name__in=group_names))
        say(f"• User created: {username} / {password}   ({', '.join(group_names)}; shown only this once)")


def register_demo_server(url: str) -> None:
    """Register the bundled demo server as "demo" (its port may differ from the last run) and discover its tools."""
    from taskhub.servers.discovery import DiscoveryFailed, discover_and_record
    from taskhub.servers.models import Server
    from taskhub.servers.services import create_server, update_server

    server = Server.objects.filter(name="demo", removed_at__isnull=True).first()
    if server is None:
        server = create_server(name="demo", transport="http", url=url, user=None)
    elif server.url != url or server.transport != "http":
        server = update_server(server=server, user=None, transport="http", url=url)
    try:
        discovery = discover_and_record(server=server)
        say(f"  registered as server 'demo' with {len(discovery.tools)} tools")
    except DiscoveryFailed as failure:
        say(f"  registered as server 'demo', but discovery failed: {failure}")


class InProcessWorker:
    """`manage.py worker` (jobs and tracker) on a thread of this process, so the in-memory channel layer reaches
    the web pages: the one-command demo needs no Redis."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._loop = None
        self._stop = None
        self._thread = threading.Thread(target=self._run, name="taskhub-worker", daemon=True)

    def start(self) -> None:
        say("• Starting the worker (background jobs and the task tracker) …")
        self._thread.start()
        self._ready.wait(timeout=30)

    def _run(self) -> None:
        import asyncio

        from django.db import connection
        from procrastinate.contrib.django import app

        from taskhub.worker.connector import worker_connector
        from taskhub.worker.management.commands.worker import run

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await run(worker_id="demo", concurrency=10, lease_seconds=30, shutdown_timeout=10, stop=self._stop)

        try:
            connection.ensure_connection()
            with app.replace_connector(worker_connector()):
                asyncio.run(main())
        except Exception as error:
            say(f"  the worker stopped: {error!r}")
        finally:
            self._ready.set()
            connection.close()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=15)
            say("  worker stopped" if not self._thread.is_alive() else "  worker did not stop within 15 s")


def start_demo_server(port: int, data_dir: Path) -> tuple[subprocess.Popen | None, str | None]:
    if importlib.util.find_spec("taskhub.demo") is None or importlib.util.find_spec("taskhub.demo.__main__") is None:
        say("• Demo MCP server: not available (taskhub.demo is not installed)")
        return None, None
    state_file = data_dir / "demo-server.sqlite3"
    command = [sys.executable, "-m", "taskhub.demo", "--http", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--state", str(state_file)]
    say("• Starting the demo MCP server …")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, bufsize=1)
    ready = threading.Event()
    url: list[str] = []

    def relay_output() -> None:
        for line in process.stdout:
            if not ready.is_set() and line.startswith(DEMO_SERVER_READY_PREFIX):
                url.append(line.removeprefix(DEMO_SERVER_READY_PREFIX).strip())
                ready.set()
            else:
                print(f"  [demo server] {line}", end="", flush=True)
        ready.set()  # output ended: the process exited

    threading.Thread(target=relay_output, name="demo-server-output", daemon=True).start()
    ready.wait(timeout=30)
    if url:
        say(f"  listening on {url[0]}")
        return process, url[0]
    say("  it did not start (see its output above); carrying on without it")
    stop_process(process, "demo MCP server")
    return None, None


def serve(listening: socket.socket, host: str, port: int, access_log: bool) -> None:
    from daphne.access import AccessLogGenerator
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server

    from taskhub.asgi import application

    shown_host = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown_host = "127.0.0.1"

    class AnnouncingServer(Server):
        def listen_success(self, port_object):
            super().listen_success(port_object)
            say(f"\ntaskhub is running at http://{shown_host}:{port}/   (Ctrl-C to stop)\n")

        def listen_error(self, failure):
            say(f"Could not listen on {host}:{port}: {failure.getErrorMessage()}")
            super().listen_error(failure)

    from twisted.internet import reactor

    def stop_reactor() -> None:
        if reactor.running:
            reactor.stop()

    def request_stop(signum, frame) -> None:
        # Queued on the reactor, so a signal that lands while it is still starting (Twisted would swallow a
        # KeyboardInterrupt raised inside a Deferred callback, e.g. right after the ready line) still stops it.
        reactor.callFromThread(stop_reactor)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    say(f"• Starting the web server (daphne) on {host}:{port} …")
    if listening.family == socket.AF_INET:
        # daphne adopts the held socket itself (a duplicate of it; Twisted closes this descriptor).
        endpoints = [f"fd:fileno={listening.detach()}"]
    else:
        # daphne's fd: endpoint only adopts IPv4 sockets: an IPv6 one is let go just before daphne binds its port.
        listening.close()
        endpoints = build_endpoint_description_strings(host=host, port=port)
    AnnouncingServer(
        application=application,
        endpoints=endpoints,
        action_logger=AccessLogGenerator(sys.stdout) if access_log else None,
        verbosity=0,
        signal_handlers=False,
    ).run()


def stop_process(process: subprocess.Popen, name: str) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        say(f"  {name} did not stop within 10 s; killing it")
        process.kill()
        process.wait()
    except ChildProcessError:
        pass  # already reaped by the reactor's SIGCHLD handling
    say(f"  {name} stopped")


def stop_embedded_database() -> None:
    from taskhub import embedded_pg

    if embedded_pg.release():
        say("  embedded Postgres stopped")
    elif embedded_pg.running_server():
        say("  embedded Postgres left running: other processes still use it")


# --- taskhub manage ----------------------------------------------------------------------------------------------


def run_manage(data_dir: Path | None, arguments: list[str]) -> int:
    if not arguments:
        say("Which manage.py command? For example: taskhub manage create_api_token operator (taskhub manage help)")
        return 2
    use_demo_settings(data_dir)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["taskhub manage", *arguments])
    return 0


# --- taskhub healthcheck ---------------------------------------------------------------------------------------

HEALTHCHECK_URL_ENV = "TASKHUB_HEALTHCHECK_URL"
DEFAULT_HEALTHCHECK_URL = "http://127.0.0.1:8000/healthz"
HEALTHCHECK_TIMEOUT_SECONDS = 4.0


def run_healthcheck(role: str | None) -> int:
    """No Django here: a check runs every few seconds for the container's whole life, so it must cost little."""
    from taskhub.worker import health

    if role is None:
        path = health.health_file()
        role = "worker" if path is not None and path.exists() else "web"
    healthy, why = health.check() if role == "worker" else web_is_healthy()
    say(f"{role}: {'healthy' if healthy else 'unhealthy'}: {why}")
    return 0 if healthy else 1


def web_is_healthy() -> tuple[bool, str]:
    import json
    import urllib.error
    import urllib.request

    url = os.environ.get(HEALTHCHECK_URL_ENV, "").strip() or DEFAULT_HEALTHCHECK_URL
    try:
        with urllib.request.urlopen(url, timeout=HEALTHCHECK_TIMEOUT_SECONDS) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        return False, f"{url} answered {error.code}"
    except (OSError, ValueError) as error:
        return False, f"{url}: {error}"
    if body.get("status") != "ok":
        return False, f"{url} says {body.get('status')!r}"
    return True, f"{url} answered ok"


# --- taskhub test -----------------------------------------------------------------------------------------------


# Most of the suite's time is spent waiting on other processes (MCP servers, workers, daphne, Chromium): its slowest
# modules keep 2 cores less than half busy (tests/test_engine_workers.py and test_held_questions.py on two workers:
# 90 % of one core over 165 s), so three pytest workers finish sooner than two even on 2 cores (CI on a 2-core Xeon,
# 2026-12-06: 1,609 s with two). A module stays on one worker (--dist loadfile), so the processes a module shares
# start once. `-n 0` (or any -n) given to `taskhub test` replaces this.
PARALLEL_PYTEST_ARGS = ["-n", "3", "--dist", "loadfile"]


def run_tests(pytest_args: list[str]) -> int:
    chooses_workers = any(
        arg in ("-n", "--numprocesses") or arg.startswith(("-n", "--numprocesses=")) for arg in pytest_args
    )
    pytest = [sys.executable, "-m", "pytest", *([] if chooses_workers else PARALLEL_PYTEST_ARGS), *pytest_args]
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        say("taskhub test: DATABASE_URL is not set, so the suite runs once, on embedded Postgres.")
        return check_pytest_exit(subprocess.run(pytest, cwd=PROJECT_DIR).returncode, "the test suite")

    say("taskhub test: pass 1 of 2, the whole suite with DATABASE_URL.")
    first = check_pytest_exit(subprocess.run(pytest, cwd=PROJECT_DIR).returncode, "pass 1 (DATABASE_URL)")
    if first not in (PYTEST_OK, PYTEST_TESTS_FAILED):
        return first  # interrupted, usage error or nothing collected: a second pass would tell nothing new

    say("\ntaskhub test: pass 2 of 2, the tests marked `embedded` again, on embedded Postgres.")
    embedded_env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    embedded_env[EMBEDDED_PASS_ENV] = "1"
    second = subprocess.run(pytest, cwd=PROJECT_DIR, env=embedded_env).returncode
    if second == PYTEST_NO_TESTS_COLLECTED:
        say("taskhub test: pass 2 had nothing to do: no selected test is marked `embedded`.")
        return first
    second = check_pytest_exit(second, "pass 2 (embedded Postgres)")
    if first == second == PYTEST_OK:
        say("taskhub test: both passes passed (DATABASE_URL and embedded Postgres).")
    return first or second


def check_pytest_exit(code: int, what: str) -> int:
    if code == PYTEST_NO_TESTS_COLLECTED:
        say(f"taskhub test: {what} collected no tests (pytest exit code 5), so nothing was tested: failing.")
    elif code != 0:
        say(f"taskhub test: {what} failed (pytest exit code {code}).")
    return code


# --- taskhub pg -------------------------------------------------------------------------------------------------


def run_pg(action: str) -> int:
    from taskhub import embedded_pg

    server = embedded_pg.running_server()
    if action == "status":
        if server is None:
            say(f"Embedded Postgres in {embedded_pg.data_dir()}: not running")
        else:
            say(f"Embedded Postgres in {server.pgdata}: running, pid {server.pid}, socket in {server.socket_dir}")
            say(f"Processes registered as using it: {embedded_pg.handle_pids() or 'none'}")
        return 0
    if embedded_pg.stop_server():
        say("Embedded Postgres stopped.")
    else:
        say("Embedded Postgres was not running.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
