"""The backend's prepared cursor (taskhub/database/base.py): its statements are prepared on the server once per
connection, read what Django's cursors read, and pass through Django's wrappers; Django's own cursors prepare
nothing."""

import json
import uuid

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from procrastinate.contrib.django.utils import connector_params as procrastinate_connector_params

from taskhub.database.params import database_params
from taskhub.database.prepared import prepared_cursor
from taskhub.tasks.models import Task
from tests.task_page_fixtures import alpha, durable, olga  # noqa: F401

pytestmark = pytest.mark.django_db

READ = 'SELECT id, created_at, arguments, server_id FROM "tasks_task" WHERE id = %s'


def prepared_statements(text: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [f"%{text}%"])
        return cursor.fetchone()[0]


def test_a_statement_is_prepared_once_per_connection_and_reads_what_django_reads(alpha, olga):  # noqa: F811
    task = durable(alpha, olga)
    mark = uuid.uuid4().hex
    marked = f"{READ} /* {mark} */"  # a text no other test prepared on this connection
    rows = []
    for _ in range(3):
        with prepared_cursor() as cursor:
            cursor.execute(marked, [task.pk])
            rows.append(cursor.fetchone())
    assert prepared_statements(mark) == 1
    with connection.cursor() as cursor:
        cursor.execute(READ, [task.pk])
        assert rows == [cursor.fetchone()] * 3  # the same types: the uuid, the aware time, the JSON
    read = Task.objects.get(pk=task.pk)
    task_id, created_at, arguments, server_id = rows[0]
    assert (task_id, created_at, json.loads(arguments), server_id) == (
        read.pk,
        read.created_at,
        read.arguments,
        read.server_id,
    )


def test_djangos_own_cursors_prepare_nothing(alpha, olga):  # noqa: F811
    task = durable(alpha, olga)
    mark = uuid.uuid4().hex
    marked = f"{READ} /* {mark} */"
    for _ in range(8):
        with connection.cursor() as cursor:
            cursor.execute(marked, [task.pk])
    assert prepared_statements(mark) == 0


def test_its_statements_pass_through_djangos_wrappers_and_errors(alpha, olga):  # noqa: F811
    task = durable(alpha, olga)
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(wrapper), prepared_cursor() as cursor:
        cursor.execute(READ, [task.pk])
    assert seen == [READ] and '"tasks_task" WHERE id' in queries.captured_queries[-1]["sql"]
    with pytest.raises(DatabaseError), prepared_cursor() as cursor:
        cursor.execute('SELECT no_such_column FROM "tasks_task" WHERE id = %s', [task.pk])


def test_only_djangos_own_connection_prepares_the_connections_beside_it_do_not():
    # The tracker's, the heartbeat's and procrastinate's connections are opened from Django's parameters, and bind
    # on the server: with a threshold in those parameters they would prepare every statement they run.
    connection.ensure_connection()
    assert connection.connection.prepare_threshold == 0
    assert database_params().get("prepare_threshold") is None
    assert procrastinate_connector_params().get("prepare_threshold") is None
