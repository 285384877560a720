"""Fixtures of the browser tests: Playwright driving Debian's chromium against a live taskhub.

- `page`: a fresh browser context (own cookies) and page; `new_page()` opens more, e.g. a second user. Every
  console error and uncaught exception of every page a test opens fails the test at teardown, with the messages;
  a test that provokes one on purpose says so: `with console_errors.expect(page, "pattern"): ...`.
- `daphne_server`: `daphne taskhub.asgi:application` in a subprocess on the test database: the pages as in
  production, live socket included (under pytest-django's WSGI live_server every page's socket is refused, a
  console error). One daphne serves the whole session (`session_daphne`); each test's rows are flushed after
  it (transactional_db), and daphne keeps nothing of them but sessions, which go too.
- `live_channel_env`: the Redis channel layer daphne uses (REDIS_URL and a prefix of this run), for the processes
  and publishes that must reach it; empty when no Redis answers.

Playwright's sync API keeps an asyncio loop running in this thread while it is open, which makes Django
refuse ORM calls (and would break async tests after it); so the browser lives for one module at a time,
and DJANGO_ALLOW_ASYNC_UNSAFE is set only while it does.
"""

import asyncio
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.browser_fixtures import (
    CHROMIUM_ARGS,
    TIMEOUT_MS,
    VIEWPORT,
    ConsoleErrors,
    DaphneServer,
    database_url_for_subprocesses,
    running_daphne,
)
from tests.test_channel_layer import LOCAL_REDIS_URL, redis_is_up

BROWSER_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items):
    # Every test here drives Chromium, so `-m "not browser"` leaves the folder out.
    for item in items:
        if item.path.is_relative_to(BROWSER_TESTS):
            item.add_marker(pytest.mark.browser)


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
def console_errors() -> ConsoleErrors:
    return ConsoleErrors()


@pytest.fixture
def new_page(browser, console_errors):
    """Opens a page in a browser context of its own (separate cookies: one per signed-in person); keyword
    arguments go to the context (e.g. java_script_enabled=False)."""
    contexts = []

    def open_page(color_scheme: str = "light", **context_options) -> Page:
        context = browser.new_context(viewport=VIEWPORT, color_scheme=color_scheme, locale="en-GB", **context_options)
        context.set_default_timeout(TIMEOUT_MS)
        console_errors.watch(context)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()
    if console_errors.seen:
        pytest.fail(f"the pages logged errors:\n{console_errors.report()}", pytrace=False)


@pytest.fixture
def page(new_page) -> Page:
    return new_page()


@pytest.fixture(scope="session")
def live_channel_env() -> Iterator[dict[str, str]]:
    if not redis_is_up(LOCAL_REDIS_URL):
        yield {}
        return
    env = {"REDIS_URL": LOCAL_REDIS_URL, "REDIS_CHANNEL_PREFIX": f"taskhub-browser-{uuid.uuid4().hex[:12]}"}
    yield env
    flush_channel_layer(env)


def flush_channel_layer(env: dict[str, str]) -> None:
    """Removes what this run left in Redis under its prefix (groups, messages)."""
    from channels_redis.core import RedisChannelLayer

    layer = RedisChannelLayer(hosts=[env["REDIS_URL"]], prefix=env["REDIS_CHANNEL_PREFIX"])
    # Playwright may keep a loop running in this thread; the flush gets a thread and a loop of its own.
    cleaner = threading.Thread(target=lambda: asyncio.run(layer.flush()))
    cleaner.start()
    cleaner.join(timeout=10)


@pytest.fixture(scope="session")
def session_daphne(django_db_setup, django_db_blocker, live_channel_env) -> Iterator[DaphneServer]:
    """One daphne for every browser test, on the test database and (when Redis is up) the run's channel layer."""
    with django_db_blocker.unblock():
        database_url = database_url_for_subprocesses()
    with running_daphne(DATABASE_URL=database_url, **live_channel_env) as server:
        yield server


@pytest.fixture
def daphne_server(session_daphne, transactional_db) -> DaphneServer:
    """taskhub's ASGI application under daphne, on the test database; rows must be committed to be seen."""
    return session_daphne
