"""Shared fixtures. The database is whatever the settings say: DATABASE_URL, or embedded Postgres when unset."""

import os
import sys
import threading
from pathlib import Path

import pytest

from tests import fast_flush

fast_flush.install()

PROJECT_DIR = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# `taskhub test` sets this for its second pass, on embedded Postgres, which repeats only the tests marked
# `embedded`: those whose outcome can differ there (raw SQL, triggers, the job queue, indexes, one whole flow).
EMBEDDED_PASS_ENV = "TASKHUB_EMBEDDED_PASS"

# Fixtures shared by several test modules: loaded here, so that no test module imports a fixture by name.
pytest_plugins = [
    "tests.demo_process",
    "tests.inbox_fixtures",
    "tests.live_fixtures",
    "tests.role_fixtures",
    "tests.stack_fixtures",
    "tests.everything_fixtures",  # after stack_fixtures, which it imports
    "tests.task_page_fixtures",
]


def pytest_report_header(config):
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    where = "embedded Postgres (DATABASE_URL unset)" if engine == "taskhub.embedded_pg" else "DATABASE_URL"
    scope = "; only the tests marked `embedded`" if os.environ.get(EMBEDDED_PASS_ENV) else ""
    return f"taskhub database: {where}{scope}"


# The modules whose tests took longest in CI (2026-12-06, three workers: each 60-210 s), run first. pytest-xdist hands
# a worker a whole module whenever it is free (--dist loadfile), in the order collected: a long module handed out
# last keeps one worker busy after the others have finished.
LONGEST_MODULES = (
    "tests/test_engine_workers.py",
    "tests/test_conformance.py",
    "tests/browser/test_accessibility.py",
    "tests/test_gateway_stack.py",
    "tests/browser/test_chinese.py",
    "tests/test_load.py",
    "tests/browser/test_held_questions.py",
    "tests/test_bulk_cancel_delivery.py",
    "tests/test_cli.py",
    "tests/browser/test_inbox_like.py",
    "tests/browser/test_oauth_connect.py",
)


def pytest_collection_modifyitems(config, items):
    first = {module: position for position, module in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: first.get(item.nodeid.partition("::")[0], len(first)))  # stable: the rest as collected
    if not os.environ.get(EMBEDDED_PASS_ENV):
        return
    kept = [item for item in items if item.get_closest_marker("embedded") is not None]
    deselected = [item for item in items if item.get_closest_marker("embedded") is None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture
def production_password_hashers(settings):
    """Passwords hashed as taskhub.settings hashes them (tests/settings.py uses a fast hasher): for a test whose
    user signs in to a web process it started, which runs taskhub.settings and accepts only those hashers."""
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS


@pytest.fixture(autouse=True)
def browser_tests_hash_passwords_as_in_production(request):
    # Every browser test signs in to a daphne that runs taskhub.settings.
    if request.node.get_closest_marker("browser"):
        request.getfixturevalue("production_password_hashers")


@pytest.fixture(autouse=True)
def each_test_starts_in_the_default_language():
    """A page read through the test client activates its reader's language on the thread and leaves it active
    (LocaleMiddleware, accounts.language): run after test_language or test_trends in one process, the webhook tests
    found their messages in Chinese."""
    yield
    from django.utils import translation

    translation.deactivate()


@pytest.fixture(autouse=True)
def each_test_counts_its_own_hours():
    """Home's trends keep the settled hours' counts in the process (trend_hours.hour_counts), under keys that name the
    database and the hour, not the test that filled it."""
    yield
    from taskhub.tasks.trend_hours import forget_kept_hours

    forget_kept_hours()


@pytest.fixture
def no_cyclic_collection():
    """The cyclic garbage collector off for the test (after a collection): what a test frees must go by reference
    counting (tests/test_template_backend.py, tests/test_acyclic_forms.py)."""
    import gc

    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.fixture(autouse=True)
def live_publishes_end_before_the_database_is_flushed():
    """A publish from async code runs on a thread of its own and reads the task. Left running, that read can
    deadlock with the TRUNCATE of a transactional test's teardown (which runs after this fixture's end)."""
    yield
    from taskhub.live.publish import PUBLISH_THREAD_NAME

    for thread in threading.enumerate():
        if thread.name == PUBLISH_THREAD_NAME:
            thread.join(timeout=10)


@pytest.fixture(autouse=True)
def the_sync_to_async_thread_keeps_no_connection():
    """sync_to_async called outside any async_to_sync (a test's asyncio.run: the worker's heartbeats, jobs) runs on
    asgiref's one process-wide thread, whose Django connection outlived the test: at the end of the run the test
    database could not be dropped ("is being accessed by other users"). Closed after each test that used it."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    executor = SyncToAsync.single_thread_executor
    if executor._threads:  # started: only then has it a connection to close
        executor.submit(connections.close_all).result(timeout=30)


# Polled at the end of a run, for up to OTHER_SESSIONS_WAIT_SECONDS, until the test database has no other session
# (processes just stopped leave theirs for a moment), then named in a warning if one is still there: Django's DROP
# DATABASE fails with only "being accessed by other users", which does not say by whom.
OTHER_SESSIONS = """
    SELECT pid, state, backend_start, left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
    FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""
OTHER_SESSIONS_WAIT_SECONDS = 10


def close_the_pools_connections() -> None:
    """Close the connections of the process's thread pools that outlive tests: the gateway's and the live layer's
    (started by any test that goes through them; each thread keeps its connection between calls, as in daphne). Many
    tests close them as they end; one that did not left an idle session that kept the test database from being
    dropped (named by the check below in CI: the pools' threads alive, the session's last statement a COMMIT)."""
    from taskhub.gateway import waiting
    from taskhub.live import threads

    for executor, close in (
        (waiting._executor, waiting.close_gateway_connections),
        (threads._executor, threads.close_live_connections),
    ):
        if executor._threads:  # started: only then have its threads connections
            close()


@pytest.fixture(scope="session", autouse=True)
def nothing_else_holds_the_test_database_at_the_end(django_db_setup, django_db_blocker):
    yield
    import gc
    import time

    from django.db import connection
    from django.db.backends.base.creation import TEST_DATABASE_PREFIX

    if not connection.settings_dict["NAME"].startswith(TEST_DATABASE_PREFIX):
        return  # no test of the run used the database, so none was made: nothing to drop
    close_the_pools_connections()
    gc.collect()  # a connection of a thread that has ended closes when its thread's locals are collected
    deadline = time.monotonic() + OTHER_SESSIONS_WAIT_SECONDS
    with django_db_blocker.unblock():
        while True:
            with connection.cursor() as cursor:
                cursor.execute(OTHER_SESSIONS)
                others = cursor.fetchall()
            if not others or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    if others:
        import warnings

        threads = ", ".join(
            sorted(thread.name for thread in threading.enumerate() if thread is not threading.main_thread())
        )
        held = "; ".join(
            f"pid {pid}, {state}, connected {started:%H:%M:%S}: {query}" for pid, state, started, query in others
        )
        warnings.warn(
            pytest.PytestWarning(
                f"the test database is still used by {len(others)} other session(s)"
                f" ({held}); this process's other threads: {threads or 'none'}"
            ),
            stacklevel=1,
        )
