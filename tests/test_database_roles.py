"""Issue 31 point 9: the audit trail is as safe as the role the application runs as.

In the two-role deployment (taskhub/database/roles.py, granted by `migrate` run as the owner) the application's role
reads and adds to the audit trail and does everything else the application does (tests/test_production.py runs
the whole stack as it), but Postgres refuses it UPDATE, DELETE and TRUNCATE of the audit table even with the escape
hatch set, and it cannot drop or disable the triggers. The hatch itself counts only for the table's owner.
"""

from __future__ import annotations

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

from taskhub.audit.models import AuditEvent
from taskhub.audit.services import record_event
from taskhub.database.roles import grant_application_role

pytestmark = pytest.mark.django_db(transaction=True)

HATCH = "SET taskhub.allow_audit_truncate = on"


def columns_but_id() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT string_agg(column_name, ', ') FROM information_schema.columns"
            " WHERE table_name = 'audit_auditevent' AND column_name <> 'id'"
        )
        return cursor.fetchone()[0]


def an_event() -> AuditEvent:
    with transaction.atomic():
        return record_event(action="server.created", data={"name": "x"})


def refused(app: psycopg.Connection, statement: str) -> str:
    """The error Postgres answers `statement` with, as the application's role with the escape hatch set."""
    with app.transaction():
        app.execute(HATCH)
        app.execute("SAVEPOINT attempt")
        with pytest.raises(psycopg.Error) as refusal:
            app.execute(statement)
        app.execute("ROLLBACK TO SAVEPOINT attempt")
    return str(refusal.value)


def test_the_application_role_adds_to_the_audit_trail_and_cannot_change_it_even_with_the_escape_hatch(
    application_role,
):
    first = an_event()
    columns = columns_but_id()
    with application_role.connect() as app:
        app.execute(
            f"INSERT INTO audit_auditevent ({columns}) SELECT {columns} FROM audit_auditevent WHERE id = %s", [first.pk]
        )
        app.commit()
        assert app.execute("SELECT count(*) FROM audit_auditevent").fetchone()[0] == 2
        for statement in (
            "UPDATE audit_auditevent SET action = 'rewritten'",
            "DELETE FROM audit_auditevent",
            "TRUNCATE audit_auditevent",
            "TRUNCATE audit_auditevent CASCADE",
        ):
            assert "permission denied for table audit_auditevent" in refused(app, statement), statement
        for statement in (
            "DROP TRIGGER audit_auditevent_append_only ON audit_auditevent",
            "ALTER TABLE audit_auditevent DISABLE TRIGGER ALL",
            "DROP TABLE audit_auditevent",
        ):
            assert "must be owner of" in refused(app, statement), statement
        # What the application does everywhere else it still may.
        app.execute("UPDATE tasks_task SET status_message = status_message")
        app.execute("DELETE FROM taskhub_cache")
        app.rollback()
    assert AuditEvent.objects.count() == 2
    assert set(AuditEvent.objects.values_list("action", flat=True)) == {"server.created"}


def test_the_escape_hatch_counts_only_for_the_owner_of_the_audit_table(application_role):
    an_event()
    with connection.cursor() as cursor:  # a privilege granted by mistake: the trigger still refuses
        cursor.execute(f"GRANT TRUNCATE ON audit_auditevent TO {application_role.name}")
    with application_role.connect() as app:
        assert "append-only: TRUNCATE refused" in refused(app, "TRUNCATE audit_auditevent")
    assert AuditEvent.objects.count() == 1


def test_the_grants_need_a_role_other_than_the_owner_and_one_that_exists():
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        owner = cursor.fetchone()[0]
    with pytest.raises(ImproperlyConfigured, match="must be another one"):
        grant_application_role(connection=connection, role=owner)
    with pytest.raises(ImproperlyConfigured, match="does not exist"):
        grant_application_role(connection=connection, role="taskhub_no_such_role")
    with pytest.raises(ImproperlyConfigured, match="not a plain role name"):
        grant_application_role(connection=connection, role='x"; DROP TABLE audit_auditevent; --')
