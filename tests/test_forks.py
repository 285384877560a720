"""Code of taskhub that leans on another project's internals fails a test as soon as the installed version differs
from the one it was written against (issue 30, item 7): each fork is read again before an upgrade lands."""

import hashlib
import importlib.metadata
import inspect

import django
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.db import connection

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
