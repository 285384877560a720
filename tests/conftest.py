"""Shared fixtures. The database is whatever the settings say: DATABASE_URL, or embedded Postgres when unset."""

import os
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# `taskhub test` sets this for its second pass, which repeats only the tests that use the database.
ONLY_DATABASE_TESTS_ENV = "TASKHUB_ONLY_DATABASE_TESTS"
DATABASE_FIXTURES = {"django_db_setup", "live_server"}

# Fixtures shared by several test modules: loaded here, so that no test module imports a fixture by name.
pytest_plugins = [
    "demo_process",
    "stack_fixtures",
]


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
