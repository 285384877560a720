"""The retention job (sweeps.purge_old_tasks): old finished tasks deleted, their audit kept."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone
from procrastinate.contrib.django import app

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import ToolInputRequired
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, Task
from taskhub.worker import jobs, sweeps
from tests.worker_jobs.job_helpers import (
    WorkerContext,
    launched,
    live_task,
    run,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]


def test_retention_deletes_old_finished_tasks_and_keeps_their_audit(server, operator, approver, settings):
    old = launched(server, operator, "mrtr")
    services.record_launch_outcome(
        task=old,
        outcome=ToolInputRequired(input_requests={"name": {"method": "elicitation/create"}}, request_state="s"),
    )
    services.request_cancel(task=old, user=operator)
    services.cancel_before_remote_task(task=old)
    recent = launched(server, operator, "quick", {"text": "recent"})
    run(jobs.launch)(recent.id)
    running = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=None, remote_id="running")
    Task.objects.filter(pk=old.pk).update(finished_at=timezone.now() - datetime.timedelta(days=31))
    Task.objects.filter(pk=running.pk).update(created_at=timezone.now() - datetime.timedelta(days=90))
    history = AuditEvent.objects.filter(task_id=old.id).count()

    assert sweeps.purge_finished(now=timezone.now(), retention_days=30) == 1
    assert set(Task.objects.values_list("pk", flat=True)) == {recent.pk, running.pk}
    assert not InputRequest.objects.filter(task_id=old.id).exists()
    assert AuditEvent.objects.filter(task_id=old.id).count() == history + 1
    assert AuditEvent.objects.filter(task_id=old.id).last().action == "task.purged"
    assert sweeps.purge_finished(now=timezone.now(), retention_days=0) == 0

    settings.TASKHUB_RETENTION_DAYS = 0
    assert run(sweeps.purge_old_tasks.__wrapped__)(WorkerContext(app), timestamp=0) == 0
