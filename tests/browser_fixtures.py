"""Helpers of the browser tests (their fixtures are in tests/browser/conftest.py) and of tests that start daphne.

- `screenshot(page, name)` saves test-output/screenshots/NAME.png; `sign_in(page, base_url, ...)`.
- `running_daphne(**env)`: `daphne taskhub.asgi:application` in a subprocess on the test database, for what
  needs ASGI (WebSockets).
- `ConsoleErrors`: the console errors and uncaught exceptions of the pages a test opens.
"""

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection
from playwright.sync_api import BrowserContext, ConsoleMessage, Page, WebError

# Not imported from conftest.py: tests/browser/conftest.py shadows that module name.
PROJECT_DIR = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
SCREENSHOT_DIR = PROJECT_DIR / "test-output" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}  # the small screen the pages must fit (no sideways scrolling)
# Playwright's default (30 s) hides a hang for too long; pages here answer in milliseconds.
TIMEOUT_MS = 10_000


def screenshot(page: Page, name: str) -> Path:
    """Saves the whole page as test-output/screenshots/NAME.png (git-ignored) for a person to look at."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    # caret="initial": hiding the caret leaves style="" on the page's inputs, which htmx copies on its next swap
    # (attributesToSettle), a style attribute the Content-Security-Policy refuses.
    page.screenshot(path=path, full_page=True, caret="initial")
    return path


class ConsoleErrors:
    """The console errors (failed loads, CSP refusals, htmx errors, console.error) and uncaught exceptions of the
    pages of the contexts watched, popups included; a test that provokes one on purpose says so with `expect`."""

    def __init__(self) -> None:
        self.seen: list[tuple[Page | None, str]] = []

    def watch(self, context: BrowserContext) -> None:
        context.on("console", self._on_console)
        context.on("weberror", self._on_error)

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            location = message.location or {}
            where = location.get("url") or (message.page.url if message.page else "?")
            if location.get("lineNumber"):
                where += f":{location['lineNumber']}:{location.get('columnNumber', 0)}"
            self.seen.append((message.page, f"console error at {where}: {message.text}"))

    def _on_error(self, error: WebError) -> None:
        self.seen.append((error.page, f"uncaught in {error.page.url if error.page else '?'}: {error.error}"))

    @contextlib.contextmanager
    def expect(self, page: Page, pattern: str) -> Iterator[None]:
        """The block makes `page` log at least one console error matching `pattern` (a regex); those it logs
        during the block are expected, every other error still fails the test."""
        before = len(self.seen)
        with page.expect_console_message(lambda message: message.type == "error" and re.search(pattern, message.text)):
            yield
        during = self.seen[before:]
        kept = [(shown, text) for shown, text in during if shown is not page or not re.search(pattern, text)]
        self.seen[before:] = kept

    def report(self) -> str:
        return "\n".join(text for _, text in self.seen)


def needs_redis(live_channel_env: dict[str, str]) -> None:
    """Skips (fails on CI) a test that needs the Redis channel layer (the live_channel_env fixture) without one."""
    if not live_channel_env:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("no Redis on 127.0.0.1:6379")


def sign_in(page: Page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def database_url_for_subprocesses(*, role: tuple[str, str] | None = None) -> str:
    """DATABASE_URL naming the very test database this test uses, for daphne and worker subprocesses; `role`: as
    that (name, password) instead of the test's own role."""
    connection.ensure_connection()
    params = connection.get_connection_params()  # the embedded backend fills in its socket and port here
    if role is not None:
        params = {**params, "user": role[0], "password": role[1]}
    host = params.get("host") or "127.0.0.1"
    user = quote(params.get("user") or "postgres", safe="")
    password = f":{quote(params['password'], safe='')}" if params.get("password") else ""
    port = params.get("port") or 5432
    return f"postgres://{user}{password}@{quote(host, safe='')}:{port}/{connection.settings_dict['NAME']}"


class DaphneServer:
    def __init__(self, url: str, process: subprocess.Popen, log_path: Path) -> None:
        self.url = url
        self.process = process
        self.log_path = log_path

    def __str__(self) -> str:
        return self.url


# Generous: on a loaded 2-core machine, importing Django, Channels and Twisted alone has taken over 30 s.
def wait_until_serving(server: DaphneServer, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"daphne exited with {server.process.returncode}:\n{server.log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{server.url}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail(f"daphne did not answer /healthz within {timeout} s:\n{server.log_path.read_text()}")


@contextlib.contextmanager
def running_daphne(**extra_env: str) -> Iterator[DaphneServer]:
    """`daphne taskhub.asgi:application` on a free port on the test database, stopped on exit."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ)
    env.update(
        DATABASE_URL=extra_env.pop("DATABASE_URL", None) or database_url_for_subprocesses(),
        DJANGO_SETTINGS_MODULE="taskhub.settings",
        DEBUG="true",  # so WhiteNoise serves static files from the finders, without collectstatic
        PYTHONUNBUFFERED="1",
    )
    env.update(extra_env)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    with daphne_process(
        port=port, env=env, cwd=PROJECT_DIR, log_path=PROJECT_DIR / "test-output" / f"daphne-{port}.log"
    ) as server:
        yield server


@contextlib.contextmanager
def daphne_process(
    *, port: int, env: dict[str, str], cwd: Path, log_path: Path, application: str = "taskhub.asgi:application"
) -> Iterator[DaphneServer]:
    """`daphne <application>` (taskhub's) of the checkout at `cwd` on 127.0.0.1:`port`, its output in `log_path`;
    serving when entered, stopped on exit (benchmarks serve another checkout, or a bare application, with it:
    bench/gateway.py)."""
    log_path.parent.mkdir(exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), application],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = DaphneServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_until_serving(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
