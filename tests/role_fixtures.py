"""A separate application role on the test database, as production's two-role deployment has it (taskhub/database/
roles.py): granted by `migrate` itself (its post_migrate hook), dropped again after the test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from tests.browser_fixtures import database_url_for_subprocesses


@dataclass(frozen=True)
class ApplicationRole:
    name: str
    password: str

    @property
    def url(self) -> str:
        return database_url_for_subprocesses(role=(self.name, self.password))

    def connect(self) -> psycopg.Connection:
        params = connection.get_connection_params()
        return psycopg.connect(
            host=params.get("host") or "127.0.0.1",
            port=params.get("port") or 5432,
            dbname=connection.settings_dict["NAME"],
            user=self.name,
            password=self.password,
        )


@pytest.fixture
def application_role(settings) -> Iterator[ApplicationRole]:
    role = ApplicationRole(name=f"taskhub_app_{uuid.uuid4().hex[:10]}", password=uuid.uuid4().hex)
    settings.TASKHUB_DATABASE_APP_ROLE, settings.TASKHUB_DATABASE_APP_PASSWORD = role.name, role.password
    call_command("migrate", verbosity=0)  # nothing to apply: its post_migrate creates the role and grants
    try:
        yield role
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP OWNED BY {role.name}; DROP ROLE {role.name}")
