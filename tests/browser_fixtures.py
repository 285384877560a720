"""Browser tests: Playwright driving Debian's chromium against a live taskhub (fixtures for tests/browser/).

- `page`: a fresh browser context (own cookies) and page; `new_page()` opens more, e.g. a second user.
- `live_server` (pytest-django): a threaded WSGI server in this process; enough for pages.
- `daphne_server`: `daphne taskhub.asgi:application` in a subprocess on the test database, for what
  needs ASGI (WebSockets).
- `screenshot(page, name)` saves test-output/screenshots/NAME.png; `sign_in(page, base_url, ...)`.

Playwright's sync API keeps an asyncio loop running in this thread while it is open, which makes Django
refuse ORM calls (and would break async tests after it); so the browser lives for one module at a time,
and DJANGO_ALLOW_ASYNC_UNSAFE is set only while it does.
"""

import contextlib
import os
import shutil
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
from playwright.sync_api import Browser, Page, expect, sync_playwright

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
# Playwright's default (30 s) hides a hang for too long; pages here answer in milliseconds.
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Browser tests need Debian's chromium: apt-get install chromium")
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        expect.set_options(timeout=TIMEOUT_MS)
        yield browser
        browser.close()


@pytest.fixture
def new_page(browser):
    """Opens a page in a browser context of its own (separate cookies: one per signed-in person)."""
    contexts = []

    def open_page(color_scheme: str = "light") -> Page:
        context = browser.new_context(viewport=VIEWPORT, color_scheme=color_scheme, locale="en-GB")
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture
def page(new_page) -> Page:
    return new_page()


def screenshot(page: Page, name: str) -> Path:
    """Saves the whole page as test-output/screenshots/NAME.png (git-ignored) for a person to look at."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    return path


def sign_in(page: Page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def database_url_for_subprocesses() -> str:
    """DATABASE_URL naming the very test database this test uses, for daphne and worker subprocesses."""
    connection.ensure_connection()
    params = connection.get_connection_params()  # the embedded backend fills in its socket and port here
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
        DATABASE_URL=database_url_for_subprocesses(),
        DJANGO_SETTINGS_MODULE="taskhub.settings",
        DEBUG="true",  # so WhiteNoise serves static files from the finders, without collectstatic
        PYTHONUNBUFFERED="1",
    )
    env.update(extra_env)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    log_path = PROJECT_DIR / "test-output" / f"daphne-{port}.log"
    log_path.parent.mkdir(exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "taskhub.asgi:application"],
            cwd=PROJECT_DIR,
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


@pytest.fixture
def daphne_server(transactional_db) -> Iterator[DaphneServer]:
    """taskhub's ASGI application under daphne, on the test database; rows must be committed to be seen."""
    with running_daphne() as server:
        yield server
