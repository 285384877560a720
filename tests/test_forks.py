"""Code of taskhub that leans on another project's internals fails a test as soon as the installed version differs
from the one it was written against (issue 30, item 7): each fork is read again before an upgrade lands."""

import hashlib
import importlib.metadata
import inspect

import django
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.db import connection

from taskhub.servers.models import Server, Transport
from taskhub.tasks import raw_rows
from taskhub.tasks.models import InputRequest, Task
from taskhub.web import request_threads

# taskhub/worker/heartbeats.py calls this function of procrastinate's schema, and worker/jobs.py and tasks/hooks.py
# write procrastinate_jobs' columns (attempts, status, lock) in plain SQL.
PROCRASTINATE_WRITTEN_FOR = (3, 10)


def test_the_request_handler_fork_matches_the_installed_django():
    assert django.VERSION[:2] == request_threads.FORKED_FROM_DJANGO, "read OneTripHandler.handle against the new Django"
    source = inspect.getsource(ASGIHandler.handle)
    assert hashlib.sha256(source.encode()).hexdigest() == request_threads.FORKED_HANDLE_SHA256, (
        "Django's ASGIHandler.handle changed: port the change to taskhub.web.request_threads.OneTripHandler.handle, "
        "then record the new hash"
    )


def test_procrastinates_version_and_the_sql_taskhub_sends_it():
    installed = tuple(int(part) for part in importlib.metadata.version("procrastinate").split(".")[:2])
    assert installed == PROCRASTINATE_WRITTEN_FOR, "read taskhub's procrastinate SQL against the new version"


@pytest.mark.django_db
def test_procrastinates_schema_has_what_taskhubs_sql_uses():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_function_identity_arguments(oid) FROM pg_proc WHERE proname = 'procrastinate_retry_job_v2'"
        )
        (arguments,) = cursor.fetchone()
        assert arguments.count(",") == 4  # (job_id, retry_at, new_priority, new_queue_name, new_lock)
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'procrastinate_jobs'"
            " AND column_name IN ('attempts', 'status', 'lock', 'task_name', 'queueing_lock')"
        )
        assert {row[0] for row in cursor.fetchall()} == {"attempts", "status", "lock", "task_name", "queueing_lock"}


def test_the_raw_rows_fork_matches_the_installed_django():
    assert django.VERSION[:2] == raw_rows.FORKED_FROM_DJANGO, "read taskhub.tasks.raw_rows against the new Django"


@pytest.mark.django_db
def test_instances_built_from_a_raw_row_equal_the_orms_and_follow_their_relations_without_a_query(
    django_assert_num_queries,
):
    server = Server.objects.create(
        name="forked", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp", headers={"X-Key": "secret"}
    )
    task = Task.objects.create(server=server, tool="deploy", arguments={"to": ["a", 1, None]})
    request = InputRequest.objects.create(task=task, key="k", method="elicitation/create", params={"message": "ok?"})
    models = (("request", InputRequest), ("task", Task), ("server", Server))
    selected = ", ".join(column for alias, model in models for column in raw_rows.columns(alias, model))
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT {selected} FROM "{InputRequest._meta.db_table}" AS request '
            f'JOIN "{Task._meta.db_table}" AS task ON task.id = request.task_id '
            f'JOIN "{Server._meta.db_table}" AS server ON server.id = task.server_id WHERE request.id = %s',
            [request.pk],
        )
        row = cursor.fetchone()
    built_request, built_task, built_server = raw_rows.instances(row, (InputRequest, Task, Server))
    raw_rows.relate(built_task, "server", built_server)
    raw_rows.relate(built_request, "task", built_task)
    for built, model in ((built_request, InputRequest), (built_task, Task), (built_server, Server)):
        from_orm = model.objects.get(pk=built.pk)
        for field in model._meta.concrete_fields:
            assert getattr(built, field.attname) == getattr(from_orm, field.attname), (model, field.name)
        assert not built._state.adding and built._state.db == "default"
    with django_assert_num_queries(0):
        assert built_request.task.server.headers == {"X-Key": "secret"}
