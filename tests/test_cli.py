"""`taskhub demo` and `taskhub test` as real subprocesses."""

import json
import os
import re
import signal
import socket
import subprocess
import urllib.request
from urllib.parse import urlparse

import psutil
import pytest

from taskhub import embedded_pg
from tests import test_audit
from tests.conftest import PROJECT_DIR, VENV_BIN
from tests.helpers import free_port
from tests.process_output import OutputLines

pytestmark = pytest.mark.slow

TASKHUB = str(VENV_BIN / "taskhub")
READY_LINE = "taskhub is running at "


class DemoRun:
    """A `taskhub demo` subprocess whose output is collected line by line."""

    def __init__(self, port: int, env: dict[str, str], *options: str):
        self.port = port
        self.process = subprocess.Popen(
            [TASKHUB, "demo", "--port", str(port), *(options or ["--no-demo-server"])],
            env=env,
            cwd=PROJECT_DIR,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._output = OutputLines(self.process)

    @property
    def output(self) -> str:
        return self._output.text

    def wait_for_line(self, text: str, timeout: float = 90) -> str:
        return self._output.wait_for(text, timeout)

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
            return response.status, response.read().decode()

    def stop(self, signum: int) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def embedded_env(tmp_path_factory):
    """Environment for a demo on its own embedded Postgres (DATABASE_URL unset), with the demo's defaults."""
    pgdata = tmp_path_factory.mktemp("demo") / "pgdata"
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "DEBUG", "SECRET_KEY")}
    env["TASKHUB_PGDATA"] = str(pgdata)
    yield env
    embedded_pg.stop_server(pgdata)


def postgres_processes_on(pgdata) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and str(pgdata) in " ".join(cmdline):
            found.append(process)
    return found


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_demo_serves_the_home_page_and_stops_its_postgres(embedded_env, signum):
    pgdata = embedded_env["TASKHUB_PGDATA"]
    demo = DemoRun(free_port(), embedded_env)
    try:
        demo.wait_for_line(READY_LINE)
        assert "Starting embedded Postgres" in demo.output
        assert "User created: admin / " in demo.output or "User 'admin' exists" in demo.output
        assert postgres_processes_on(pgdata), "the demo said it started Postgres, but none runs on its pgdata"

        status, page = demo.get("/")
        assert status == 200
        assert "The control room for long-running MCP tool calls" in page
        status, css = demo.get("/static/taskhub/taskhub.css")
        assert status == 200
        assert "--status-working" in css
        status, health = demo.get("/healthz")
        assert '"embedded": true' in health

        assert demo.stop(signum) == 0
    finally:
        demo.kill()
    assert "embedded Postgres stopped" in demo.output
    assert postgres_processes_on(pgdata) == []


def test_demo_starts_and_stops_the_demo_mcp_server(embedded_env):
    demo = DemoRun(free_port(), embedded_env, "--demo-server-port", str(free_port()))
    try:
        demo.wait_for_line(READY_LINE)
        children = psutil.Process(demo.process.pid).children()
        demo_servers = [child for child in children if "taskhub.demo" in " ".join(child.cmdline())]
        assert len(demo_servers) == 1, demo.output
        mcp_url = demo.output.split("  listening on ", 1)[1].split()[0]
        assert mcp_url.endswith("/mcp")
        assert "registered as server 'demo' with " in demo.output, demo.output
        assert "Starting the worker" in demo.output
        with socket.create_connection((urlparse(mcp_url).hostname, urlparse(mcp_url).port), timeout=5):
            pass
        assert demo.stop(signal.SIGINT) == 0
    finally:
        demo.kill()
    assert "demo MCP server stopped" in demo.output
    assert "worker stopped" in demo.output
    assert not demo_servers[0].is_running()


def test_demo_creates_its_users_once(embedded_env):
    outputs = []
    for _ in range(2):
        demo = DemoRun(free_port(), embedded_env)
        try:
            demo.wait_for_line(READY_LINE)
            demo.stop(signal.SIGINT)
        finally:
            demo.kill()
        outputs.append(demo.output)
    # The module's earlier test may have created it already; the second run must always find it.
    for username in ("admin", "operator", "approver"):
        assert f"User '{username}' exists" in outputs[1]
        created = [output for output in outputs if f"User created: {username} / " in output]
        assert len(created) <= 1


def test_demo_says_when_the_port_is_taken(embedded_env):
    with socket_listening() as port:
        demo = DemoRun(port, embedded_env)
        code = demo.process.wait(timeout=30)
    demo.wait_for_line("already in use")
    assert code == 2
    assert "Starting embedded Postgres" not in demo.output


def test_demo_holds_its_web_port_from_the_start_and_manage_commands_run_with_its_settings(embedded_env):
    # The demo MCP server asks for the very port the web server will use: held since before the database started,
    # it cannot be taken, so the demo server fails (and is skipped) and taskhub still serves on it.
    port = free_port()
    demo = DemoRun(port, embedded_env, "--demo-server-port", str(port))
    try:
        demo.wait_for_line(READY_LINE)
        assert "it did not start (see its output above); carrying on without it" in demo.output, demo.output
        assert demo.get("/healthz")[0] == 200

        # The README's management commands, right after `taskhub demo`, in an environment without DEBUG and
        # SECRET_KEY (as a shell next to the demo has): `taskhub manage` uses the demo's settings and database.
        def manage(*arguments: str) -> str:
            done = subprocess.run(
                [TASKHUB, "manage", *arguments], env=embedded_env, cwd=PROJECT_DIR, capture_output=True, text=True
            )
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        token = manage("create_api_token", "operator", "--name", "from the README").strip()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/tasks")
        request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        assert isinstance(json.loads(manage("tasks", "--json")), list | dict)
        # Without EMAIL_HOST, mail prints to the console (the demo's notification digests too).
        assert "To: approver@example.com" in manage("sendtestemail", "approver@example.com")
        assert demo.stop(signal.SIGINT) == 0
    finally:
        demo.kill()


def test_every_command_the_readme_runs_through_taskhub_manage_exists():
    from django.core.management import get_commands

    readme = (PROJECT_DIR / "README.md").read_text()
    named = set(re.findall(r"uv run taskhub manage (\w+)", readme))
    assert {"create_api_token", "server", "launch", "tasks"} <= named
    assert named <= set(get_commands()), named - set(get_commands())
    # The scripting commands are written as `taskhub manage` (they run next to the demo as written); `python
    # manage.py` is left to the production commands, which run in a deployment's own environment.
    written_for_python = set(re.findall(r"uv run python manage.py (\w+)", readme))
    # `audit` (verify, archive, drop) is the owner role's, in a deployment; makemessages and compilemessages are
    # Django's own, for whoever adds a language (README, Languages).
    allowed = {"migrate", "collectstatic", "worker", "audit", "makemessages", "compilemessages"}
    assert written_for_python <= allowed, written_for_python


class socket_listening:
    def __enter__(self) -> int:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        return self.socket.getsockname()[1]

    def __exit__(self, *exc_info) -> None:
        self.socket.close()


def run_taskhub_test(*pytest_args: str, database_url: str | None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    if database_url:
        env["DATABASE_URL"] = database_url
    return subprocess.run(
        [TASKHUB, "test", "-n", "0", "-p", "no:cacheprovider", *pytest_args],
        env=env,
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_taskhub_test_fails_when_nothing_is_collected():
    result = run_taskhub_test("tests/test_settings.py", "-k", "no_test_has_this_name", database_url=None)
    assert result.returncode == 5
    assert "collected no tests" in result.stdout


def test_taskhub_test_skips_the_embedded_pass_when_no_selected_test_is_marked_embedded():
    url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/taskhub"
    result = run_taskhub_test("tests/test_settings.py", "-k", "debug_gets", database_url=url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert "pass 2 had nothing to do" in result.stdout


def test_taskhub_test_repeats_only_the_tests_marked_embedded_on_embedded_postgres():
    url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/taskhub"
    result = run_taskhub_test("tests/test_audit.py", "--collect-only", "-q", database_url=url)
    assert result.returncode == 0, result.stdout + result.stderr
    first, second = result.stdout.split("pass 2 of 2")
    tests = [function for name, function in vars(test_audit).items() if name.startswith("test_")]
    marked = [test for test in tests if "embedded" in {mark.name for mark in getattr(test, "pytestmark", [])}]
    assert 0 < len(marked) < len(tests)
    assert f"{len(tests)} tests collected" in first
    assert f"{len(marked)}/{len(tests)} tests collected ({len(tests) - len(marked)} deselected)" in second
