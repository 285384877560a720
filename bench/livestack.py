"""What bench/freshness.py and bench/approval.py share: the whole product in real processes, driven by a browser.

The stack: a database of the benchmark's own (dropped and created), migrated; the Redis channel layer (and cache,
where the sessions of this process and daphne's meet) under a prefix of the run's own; daphne and one
`manage.py worker` started by tests/stack_fixtures.py and tests/browser_fixtures.py (imported, not copied);
bench/demo_control_server.py as the MCP server; Debian's chromium through Playwright. Tasks are seeded through
the product's own services (`launch` then `record_launch_outcome` with the server's CreateTaskResult), so rows,
audit and poll schedule are what a launch from the page leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from benchlib import machine, percentile, set_database

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SECRET_KEY = "taskhub-bench-only-not-secret"
STARTED = time.monotonic()
STATIC_ROOT = ROOT / "test-output" / "bench-static"
# What daphne and the worker get of the benchmark's environment (the database comes from the tests' helpers).
PROCESS_SETTINGS = (
    "REDIS_URL",
    "REDIS_CHANNEL_PREFIX",
    "SECRET_KEY",
    "HTTPS_ONLY",
    "DEBUG",
    "ALLOWED_HOSTS",
    "STATIC_ROOT",
)

# Runs in every page before its own scripts: a MutationObserver that stamps (performance.timeOrigin + now(), the
# wall clock in ms, comparable with the server's time.time()) the moment an element with a given id first has a
# given class; and the submit of a form, captured before htmx handles it.
OBSERVER_JS = """
(() => {
  const pending = [];
  const now = () => performance.timeOrigin + performance.now();
  window.__benchSeen = {};
  window.__benchSubmits = [];
  window.__benchResponses = [];
  window.__benchWsMessages = 0;
  window.__benchFrames = [];
  const check = () => {
    for (let i = pending.length - 1; i >= 0; i--) {
      const [id, cls] = pending[i];
      const element = document.getElementById(id);
      if (element && element.classList.contains(cls)) {
        window.__benchSeen[id] = now();
        pending.splice(i, 1);
      }
    }
  };
  window.__benchExpect = (id, cls) => { delete window.__benchSeen[id]; pending.push([id, cls]); check(); };
  new MutationObserver(check).observe(document, {subtree: true, childList: true, attributes: true,
                                                 attributeFilter: ["class"]});
  document.addEventListener("submit", (event) => {
    window.__benchSubmits.push([event.target.getAttribute("action"), now()]);
  }, true);
  document.addEventListener("htmx:afterRequest", () => { window.__benchResponses.push(now()); });
  document.addEventListener("htmx:wsBeforeMessage", () => { window.__benchFrames.push(now()); });
  document.addEventListener("htmx:wsAfterMessage", () => { window.__benchWsMessages += 1; });
  // The last socket frame received at or before `time`: when what a stamped change came in arrived.
  window.__benchFrameBefore = (time) => Math.max(0, ...window.__benchFrames.filter((t) => t <= time));
})();
"""


def say(text: str) -> None:
    """A progress line, with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - STARTED:5.0f} s] {text}", flush=True)


def load() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


def ms(seconds: float) -> float:
    return seconds * 1000


def spread(values: list[float]) -> dict[str, float]:
    """p50 / p95 / max of a list of milliseconds (NaN when empty)."""
    if not values:
        return {"n": 0, "p50": float("nan"), "p95": float("nan"), "max": float("nan")}
    return {"n": len(values), "p50": percentile(values, 0.5), "p95": percentile(values, 0.95), "max": max(values)}


def prepare(database_url: str, redis_url: str, prefix: str) -> dict[str, str]:
    """Fresh database, migrated; this process set up as taskhub on it; the tests' helpers importable."""
    env = {
        "DJANGO_SETTINGS_MODULE": "taskhub.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "REDIS_CHANNEL_PREFIX": prefix,
        "SECRET_KEY": SECRET_KEY,
        # Production settings, as the README deploys taskhub: DEBUG off, static files collected and served by
        # WhiteNoise from STATIC_ROOT (with DEBUG on they would come from the finders, a slower path).
        "DEBUG": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "HTTPS_ONLY": "false",  # plain HTTP between the browser and daphne; HTTPS is a proxy's job
        "STATIC_ROOT": str(STATIC_ROOT),
    }
    os.environ.update(env)
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    set_database(database_url, create=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, check=True)
    for path in (ROOT, ROOT / "tests"):
        sys.path.insert(0, str(path))
    import django

    django.setup()
    return env


def drop(database_url: str) -> None:
    from django.db import connections

    connections.close_all()
    set_database(database_url, create=False)


def script_server(script: str, *options: str) -> tuple[int, subprocess.Popen]:
    """A server script of bench/ in a subprocess on a free port, once it says it is listening; (port, process)."""
    from benchlib import free_port

    port = free_port()
    command = [sys.executable, str(BENCH / script), "--port", str(port), *options]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = process.stdout.readline()
    if "listening on" not in line:
        raise SystemExit(f"{script} did not start: {line!r}")
    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
    return port, process


class ControlServer:
    """bench/demo_control_server.py in a subprocess on a free port."""

    def __init__(self, *options: str) -> None:
        self.port, self.process = script_server("demo_control_server.py", *options)
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/mcp"

    def _call(self, path: str, method: str = "GET") -> dict:
        request = urllib.request.Request(self.base + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def create(self, tool: str, count: int) -> list[dict]:
        return self._call(f"/bench/create?tool={tool}&count={count}", "POST")["tasks"]

    def finish(self, task_id: str) -> float:
        return self._call(f"/bench/finish?task={task_id}", "POST")["changedAt"]

    def watched(self, task_id: str) -> bool:
        return self._call(f"/bench/watched?task={task_id}")["watched"]

    def updates(self) -> dict[str, float]:
        return self._call("/bench/updates")

    def next_poll(self, task_id: str, after: float) -> float | None:
        """When the first `tasks/get` of the task after `after` (time.time()) reached the server (waits for it)."""
        return self._call(f"/bench/next-poll?task={task_id}&after={after!r}")["at"]

    def polls(self) -> dict[str, list[float]]:
        return self._call("/bench/polls")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def bench_user():
    """One person who administers, operates and approves (sees every task, answers every server's questions)."""
    from account_fixtures import make_user

    from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS

    return make_user(f"bench-{uuid.uuid4().hex[:6]}", ADMINS, OPERATORS, APPROVERS)


def register(control: ControlServer, user, name: str):
    from stack_fixtures import register_and_discover

    return register_and_discover(control, user, name=name)


def seed(server, user, tool: str, wires: list[dict]) -> dict[str, uuid.UUID]:
    """Tasks as launched from the page and answered by the server with these tasks: remote id -> task id."""
    from taskhub.mcp.client import TaskCreated
    from taskhub.mcp.wire import parse_get_task_result
    from taskhub.tasks import services

    seeded = {}
    for wire in wires:
        task = services.launch(server=server, tool=tool, arguments={}, user=user)
        snapshot = parse_get_task_result({"resultType": "complete", **wire})
        services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot))
        seeded[wire["taskId"]] = task.pk
    return seeded


@contextlib.contextmanager
def web_and_worker(env: dict[str, str], name: str) -> Iterator[tuple[object, object]]:
    """daphne and one worker on the benchmark's database and channel prefix; (daphne, worker process)."""
    from browser_fixtures import running_daphne
    from stack_fixtures import Workers, worker_environment, worker_log

    redis = {key: env[key] for key in PROCESS_SETTINGS}
    workers = Workers(worker_environment(**redis))
    worker = workers.start(name)
    try:
        with running_daphne(**redis) as web:
            log = worker_log(name)
            deadline = time.monotonic() + 60
            while "running" not in log.read_text():
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the worker did not start:\n{log.read_text()}")
                time.sleep(0.2)
            yield web, worker
    finally:
        workers.stop_all()


# The browser stands for the person's own machine; here it shares the two cores with taskhub, and Chromium (the
# benchmark's Playwright driving it, hovering and hit-testing before each click, rastering each frame in software)
# took 75% of a core during bench/approval.py's clicks, a third of the answer view's time in daphne and Postgres
# (bench/RESULTS.md, session 12). Pinned to one core, it can take at most that one; taskhub's processes keep both.
BROWSER_CORES_HELP = (
    "CPU cores for the browser (Playwright's driver and Chromium), e.g. 0 or 0,1; 'all': not pinned "
    "(default 0: the person's machine gets one core, taskhub's processes keep both)"
)


def browser_cores(text: str) -> set[int] | None:
    """--browser-cores: None for 'all' (or a machine with one core); otherwise the cores, which must exist."""
    available = os.sched_getaffinity(0)
    if text == "all" or len(available) < 2:
        return None
    try:
        cores = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise SystemExit(f"--browser-cores: {text!r} is not 'all' or a list of core numbers such as 0,1") from None
    if not cores or not cores <= available:
        raise SystemExit(f"--browser-cores: {text!r} names cores this process may not use ({sorted(available)})")
    return cores


def browser_cores_said(cores: set[int] | None) -> str:
    if cores is None:
        return "the browser not pinned (it shares every core with taskhub)"
    listed = ",".join(map(str, sorted(cores)))
    return f"the browser (Playwright's driver, Chromium) pinned to core {listed} with sched_setaffinity"


@contextlib.contextmanager
def _affinity(cores: set[int] | None) -> Iterator[None]:
    """This thread on `cores` while inside: the processes it starts meanwhile inherit them."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def signed_in_browser(base_url: str, user, *, cores: set[int] | None = None) -> Iterator[object]:
    """A Chromium context holding `user`'s session (made in this process; same SECRET_KEY and cache as daphne).
    `cores`: Playwright's driver and Chromium run there (browser_cores); None: anywhere."""
    from browser_fixtures import CHROMIUM_ARGS, VIEWPORT
    from django.conf import settings
    from playwright.sync_api import sync_playwright
    from stack_fixtures import session_cookie_for

    cookie = session_cookie_for(user)
    executable = shutil.which("chromium") or "/usr/bin/chromium"
    with contextlib.ExitStack() as stack:
        with _affinity(cores):  # the driver and Chromium start here, and keep these cores
            playwright = stack.enter_context(sync_playwright())
            browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        # bypass_csp: Playwright's wait_for_function evaluates its predicate with new Function, which the CSP forbids.
        context = browser.new_context(viewport=VIEWPORT, locale="en-GB", bypass_csp=True)
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": base_url}])
        context.add_init_script(OBSERVER_JS)
        context.set_default_timeout(15_000)
        try:
            yield context
        finally:
            browser.close()


def wait_live(page, messages: int = 1, timeout: float = 30.0) -> None:
    """Until the page's live socket is open and has had `messages` frames (on connect: the nav counts; after a
    watch: the watched task's sections)."""
    live = "document.getElementById('live-indicator')?.dataset.state === 'live'"
    page.wait_for_function(
        f"{live} && window.__benchWsMessages >= {messages}",
        timeout=timeout * 1000,
    )


@contextlib.contextmanager
def profiled(processes: dict[str, int], prefix: str) -> Iterator[list[str]]:
    """py-spy (raw collapsed stacks, 500 Hz, idle excluded) on each named process while inside; yields the files
    (summarise with bench/profile_summary.py). Without a prefix, or without py-spy, nothing."""
    import signal

    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not prefix or not Path(py_spy).exists():
        if prefix:
            print("(no py-spy: `uv pip install py-spy` for a profile)", flush=True)
        yield []
        return
    spies, files = [], []
    for name, pid in processes.items():
        out = f"{prefix}-{name}.txt"
        command = [py_spy, "record", "-p", str(pid), "-r", "500", "-f", "raw", "-o", out, "--nonblocking"]
        spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        files.append(out)
    try:
        yield files
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for spy in spies:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()


def results_header(title: str, command: str, load_start: str) -> list[str]:
    return [
        f"## {title}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"- command: `{command.strip()}`",
        f"- machine: {machine()}; load average at start {load_start}, at end {load()}",
    ]


def append_results(path: Path, text: str) -> None:
    with path.open("a") as results:
        results.write("\n" + text)
    print(f"appended to {path}")
