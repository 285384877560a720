"""Shared fixtures. The database is whatever the settings say: DATABASE_URL, or embedded Postgres when unset."""

import os
import socket
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# `taskhub test` sets this for its second pass, which repeats only the tests that use the database.
ONLY_DATABASE_TESTS_ENV = "TASKHUB_ONLY_DATABASE_TESTS"
DATABASE_FIXTURES = {"django_db_setup", "live_server"}


def uses_database(item: pytest.Item) -> bool:
    return item.get_closest_marker("django_db") is not None or bool(DATABASE_FIXTURES & set(item.fixturenames))


def pytest_report_header(config):
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    where = "embedded Postgres (DATABASE_URL unset)" if engine == "taskhub.embedded_pg" else "DATABASE_URL"
    scope = "; only tests that use the database" if os.environ.get(ONLY_DATABASE_TESTS_ENV) else ""
    return f"taskhub database: {where}{scope}"


def pytest_collection_modifyitems(config, items):
    if not os.environ.get(ONLY_DATABASE_TESTS_ENV):
        return
    kept = [item for item in items if uses_database(item)]
    deselected = [item for item in items if not uses_database(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    return free_tcp_port()
