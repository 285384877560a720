"""The expiry sweep (sweeps.expire_overdue): live tasks past createdAt + ttl without progress expire."""

from __future__ import annotations

import datetime
import importlib

import pytest
from django.apps import apps as django_apps
from django.db import connection

from taskhub.tasks import services
from taskhub.tasks.models import Task, TaskPoll, TaskStatus
from taskhub.worker import sweeps
from tests.helpers import snapshot
from tests.worker_jobs.job_helpers import (
    live_task,
    reload,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]


# --- sweeps -----------------------------------------------------------------------------------------


def test_the_expiry_sweep_expires_live_tasks_past_created_at_plus_ttl_without_progress(server, operator):
    overdue = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=60_000, remote_id="old")
    unlimited = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=None, remote_id="forever")
    fresh = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=10**12, remote_id="fresh")
    # The deadline is past for `overdue` only; it last changed before the deadline (set by the test clock).
    Task.objects.filter(pk=overdue.pk).update(updated_at=datetime.datetime(2026, 7, 28, 10, 0, 30, tzinfo=datetime.UTC))
    now = datetime.datetime(2026, 7, 28, 10, 3, tzinfo=datetime.UTC)

    assert [task.pk for task in sweeps.expire_overdue(now=now)] == [overdue.pk]
    assert reload(overdue).status == TaskStatus.EXPIRED
    assert not TaskPoll.objects.filter(task=overdue).exists()
    assert reload(unlimited).status == reload(fresh).status == TaskStatus.WORKING
    assert sweeps.expire_overdue(now=now) == []


def test_a_task_that_changed_after_its_deadline_is_not_expired(server, operator):
    task = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=60_000, remote_id="busy")
    Task.objects.filter(pk=task.pk).update(updated_at=datetime.datetime(2026, 7, 28, 10, 2, tzinfo=datetime.UTC))
    assert sweeps.expire_overdue(now=datetime.datetime(2026, 7, 28, 10, 5, tzinfo=datetime.UTC)) == []
    # Within the grace after the deadline the tracker may still see the true end.
    assert sweeps.expire_overdue(now=datetime.datetime(2026, 7, 28, 10, 1, 30, tzinfo=datetime.UTC)) == []


def test_the_end_moves_with_what_the_server_says_and_one_no_date_holds_never_comes(server, operator):
    task = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=60_000, remote_id="moving")
    assert task.expires_at == datetime.datetime(2026, 7, 28, 10, 1, tzinfo=datetime.UTC)
    # The server lengthens the TTL: the task's end moves with it, and the sweep leaves it be.
    longer = snapshot(task_id="moving", created_at="2026-07-28T10:00:00Z", last_updated_at="2026-07-28T10:00:40Z")
    services.apply_snapshot(task=task, snapshot=longer.model_copy(update={"ttl_ms": 3_600_000}))
    assert reload(task).expires_at == datetime.datetime(2026, 7, 28, 11, 0, tzinfo=datetime.UTC)
    # A TTL past what a date holds is unlimited: it stopped the sweep with an OverflowError each minute before.
    endless = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=10**17, remote_id="endless")
    assert reload(endless).expires_at is None
    overdue = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=1_000, remote_id="gone")
    Task.objects.filter(pk__in=[task.pk, endless.pk, overdue.pk]).update(
        updated_at=datetime.datetime(2026, 7, 28, 10, 0, tzinfo=datetime.UTC)
    )
    now = datetime.datetime(2026, 7, 28, 10, 30, tzinfo=datetime.UTC)
    assert [each.pk for each in sweeps.expire_overdue(now=now)] == [overdue.pk]
    assert reload(task).status == reload(endless).status == TaskStatus.WORKING


def test_migration_0026_fills_in_the_end_of_every_live_task_and_of_no_other(server, operator):
    live = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=60_000, remote_id="live")
    ended = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=60_000, remote_id="ended")
    unreadable = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=60_000, remote_id="odd")
    Task.objects.filter(pk=ended.pk).update(status=TaskStatus.COMPLETED)
    Task.objects.filter(pk=unreadable.pk).update(remote_created_at="not a time")
    Task.objects.update(expires_at=None)  # as the column is before the migration fills it in

    fill = importlib.import_module("taskhub.tasks.migrations.0026_task_expires_at").fill_live_tasks
    with connection.schema_editor() as editor:
        fill(django_apps, editor)

    assert reload(live).expires_at == datetime.datetime(2026, 7, 28, 10, 1, tzinfo=datetime.UTC)
    assert reload(ended).expires_at is None and reload(unreadable).expires_at is None
