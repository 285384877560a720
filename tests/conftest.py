"""Shared fixtures. The database is whatever the settings say: DATABASE_URL, or embedded Postgres when unset."""

import os
import socket
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# `taskhub test` sets this for its second pass, on embedded Postgres, which repeats only the tests marked
# `embedded`: those whose outcome can differ there (raw SQL, triggers, the job queue, indexes, one whole flow).
EMBEDDED_PASS_ENV = "TASKHUB_EMBEDDED_PASS"


def pytest_report_header(config):
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    where = "embedded Postgres (DATABASE_URL unset)" if engine == "taskhub.embedded_pg" else "DATABASE_URL"
    scope = "; only the tests marked `embedded`" if os.environ.get(EMBEDDED_PASS_ENV) else ""
    return f"taskhub database: {where}{scope}"


def pytest_collection_modifyitems(config, items):
    if not os.environ.get(EMBEDDED_PASS_ENV):
        return
    kept = [item for item in items if item.get_closest_marker("embedded") is not None]
    deselected = [item for item in items if item.get_closest_marker("embedded") is None]
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
