"""Two database roles in production: the owner, which `migrate` runs as, and the application's, which the web
processes and workers run as.

The audit trail's triggers refuse UPDATE, DELETE and TRUNCATE (audit migrations 0003, 0006), but a table's owner can
drop a trigger, and the escape hatch the test suite uses for TRUNCATE (`taskhub.allow_audit_truncate`) is a setting
any session can set. So the application runs as a role that owns nothing: it may read and write every table of
taskhub's schema except the audit trail, which it may only read and add to. With no UPDATE, DELETE or TRUNCATE
privilege on it, Postgres refuses those before any trigger runs, escape hatch or not; owning no table, it cannot
drop a trigger or alter a table either. (Since audit migration 0008 the hatch is the owner's alone as well.)

`migrate`, run as the owner with `TASKHUB_DATABASE_APP_ROLE` set, grants this after every migration (post_migrate),
so a table a new release adds is covered the moment it exists. With `TASKHUB_DATABASE_APP_PASSWORD` set too, it
creates the role (or sets its password) first; without it the role must exist. compose.yaml and the README's
Production section set it up. The one-command demo (embedded Postgres) keeps one role.
"""

from __future__ import annotations

import re

from django.core.exceptions import ImproperlyConfigured
from psycopg import sql

AUDIT_TABLE = "audit_auditevent"
ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role};
REVOKE ALL ON {audit} FROM {role};
GRANT SELECT, INSERT ON {audit} TO {role};
"""


def checked_role_name(name: str, *, setting: str = "TASKHUB_DATABASE_APP_ROLE") -> str:
    if not ROLE_NAME.match(name):
        raise ImproperlyConfigured(
            f"{setting}: {name!r} is not a plain role name (lower-case letters, digits and _, at most 63)."
        )
    return name


def grant_application_role(*, connection, role: str, password: str = "") -> None:
    """Give `role` what the application needs and no more (see the module's docstring); run as the owner."""
    role = checked_role_name(role)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, current_schema()")
        owner, schema = cursor.fetchone()
        if role == owner:
            raise ImproperlyConfigured(
                f"TASKHUB_DATABASE_APP_ROLE is {role!r}, the role migrate runs as: the application's role must be"
                " another one, which owns nothing (README: Production)."
            )
        raw = connection.connection
        if password:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            verb = "ALTER" if cursor.fetchone() else "CREATE"
            statement = sql.SQL(verb + " ROLE {role} LOGIN PASSWORD {password}").format(
                role=sql.Identifier(role), password=sql.Literal(password)
            )
            cursor.execute(statement.as_string(raw))
        else:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone() is None:
                raise ImproperlyConfigured(
                    f"The database role {role!r} (TASKHUB_DATABASE_APP_ROLE) does not exist: create it"
                    f" (CREATE ROLE {role} LOGIN PASSWORD '…') or set TASKHUB_DATABASE_APP_PASSWORD and run migrate"
                    " again as a role that may create roles."
                )
        grants = sql.SQL(GRANTS).format(
            schema=sql.Identifier(schema), role=sql.Identifier(role), audit=sql.Identifier(AUDIT_TABLE)
        )
        cursor.execute(grants.as_string(raw))
        # The audit trail's monthly partitions (audit migration 0009): reached through the parent table only, whose
        # grants above apply; the schema-wide grant gave the ones that exist now UPDATE and DELETE directly.
        cursor.execute("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass", [AUDIT_TABLE])
        for (partition,) in cursor.fetchall():
            revoke = sql.SQL("REVOKE ALL ON {partition} FROM {role}").format(
                partition=sql.Identifier(partition), role=sql.Identifier(role)
            )
            cursor.execute(revoke.as_string(raw))


def grant_after_migrate(sender, *, using: str = "default", **kwargs) -> None:
    """post_migrate (once, for the audit app): the grants, when a separate application role is configured."""
    from django.conf import settings
    from django.db import connections

    if settings.TASKHUB_DATABASE_APP_ROLE:
        grant_application_role(
            connection=connections[using],
            role=settings.TASKHUB_DATABASE_APP_ROLE,
            password=settings.TASKHUB_DATABASE_APP_PASSWORD,
        )
