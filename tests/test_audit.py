"""The audit trail is append-only at the database level, and only registered event types can be recorded."""

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from taskhub.audit.events import AUDIT_EVENTS, UnknownAuditAction
from taskhub.audit.models import AuditEvent
from taskhub.audit.services import record_event
from taskhub.servers.services import create_server
from taskhub.tasks.models import Task
from taskhub.tasks.services import launch
from tests.catalogue_fixtures import with_tools

pytestmark = pytest.mark.django_db


@pytest.fixture
def server():
    return with_tools(create_server(name="audited", transport="http", url="http://127.0.0.1:9/mcp", user=None), "echo")


@pytest.mark.embedded
def test_update_of_an_audit_row_is_refused_by_the_database(server):
    event = AuditEvent.objects.get(server=server, action="server.created")
    with (
        pytest.raises(DatabaseError, match="append-only: UPDATE refused"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE audit_auditevent SET actor_label = 'mallory' WHERE id = %s", [event.id])
    event.refresh_from_db()
    assert event.actor_label == "system"


@pytest.mark.embedded
def test_delete_of_audit_rows_is_refused_by_the_database(server):
    count = AuditEvent.objects.count()
    with (
        pytest.raises(DatabaseError, match="append-only: DELETE refused"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("DELETE FROM audit_auditevent")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(server=server).delete()
    assert AuditEvent.objects.count() == count


def test_an_unregistered_action_is_refused():
    with pytest.raises(UnknownAuditAction, match=r"'task\.teleported' is not a registered"), transaction.atomic():
        record_event(action="task.teleported")
    assert not AuditEvent.objects.filter(action="task.teleported").exists()


@pytest.mark.django_db(transaction=True)
def test_recording_outside_a_transaction_is_a_programming_error():
    with pytest.raises(RuntimeError, match="inside the transaction"):
        record_event(action="server.created")


def test_every_registered_action_has_a_description():
    assert all(isinstance(text, str) and text for text in AUDIT_EVENTS.values())
    assert {"task.launched", "input.answered", "task.protocol_error", "server.created"} <= set(AUDIT_EVENTS)


def test_deleting_an_old_task_leaves_its_audit_rows_pointing_at_its_id(server, django_user_model):
    task = launch(server=server, tool="echo", arguments={}, user=None)
    Task.objects.filter(pk=task.pk).delete()
    event = AuditEvent.objects.get(action="task.launched")
    assert event.task_id == task.id
    assert event.data["tool"] == "echo"


def test_deleting_a_user_keeps_their_name_on_their_audit_rows(server, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    launch(server=server, tool="echo", arguments={}, user=alice)
    alice_id = alice.pk
    alice.delete()
    event = AuditEvent.objects.get(action="task.launched")
    assert (event.actor_id, event.actor_label) == (alice_id, "alice")


@pytest.mark.embedded
def test_truncate_of_the_audit_table_is_refused_by_the_database(server):
    count = AuditEvent.objects.count()
    with (
        pytest.raises(DatabaseError, match="append-only: TRUNCATE refused"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        # As every session outside the test suite: tests/settings.py lets the suite's own flush through.
        cursor.execute("SET LOCAL taskhub.allow_audit_truncate = off")
        cursor.execute("TRUNCATE audit_auditevent CASCADE")
    assert AuditEvent.objects.count() == count


@pytest.mark.django_db(transaction=True)
def test_the_test_suites_flush_may_empty_the_audit_table(server):
    # What pytest-django does after every transactional test; without the opt-in it would fail here.
    with connection.cursor() as cursor:
        cursor.execute("SHOW taskhub.allow_audit_truncate")
        assert cursor.fetchone() == ("on",)
