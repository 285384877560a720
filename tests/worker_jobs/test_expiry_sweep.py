"""The expiry sweep (sweeps.expire_overdue): live tasks past createdAt + ttl without progress expire."""

from __future__ import annotations

import datetime

import pytest

from taskhub.tasks.models import Task, TaskPoll, TaskStatus
from taskhub.worker import sweeps
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
