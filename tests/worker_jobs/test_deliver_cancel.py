"""The cancel delivery job: delivered once and the task polled at once; waiting for a tool call under way; a cancel
during MRTR rounds."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from taskhub.mcp.client import TaskCreated, TasksClient
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, TaskPoll, TaskStatus
from taskhub.worker import jobs
from tests.stack_fixtures import run_worker_until_idle
from tests.worker_jobs.job_helpers import (
    audit,
    demo_stats,
    follow,
    jobs_of,
    launched,
    reload,
    run,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]


# --- cancel delivery --------------------------------------------------------------------------------


def test_a_cancel_is_delivered_once_and_the_task_polled_at_once(server, operator, demo):
    task = launched(server, operator, "long", {"seconds": 30})
    run(jobs.launch)(task.id)
    task = reload(task)
    TaskPoll.objects.filter(task=task).update(next_poll_at=timezone.now() + datetime.timedelta(hours=1))
    services.request_cancel(task=task, user=operator)
    [job] = jobs_of("taskhub.deliver_cancel")
    assert job.args == {"task_id": str(task.id)}

    run(run_worker_until_idle)()
    assert run(jobs.cancel)(task.id) == "nothing to cancel"
    task = reload(task)
    assert task.cancel_delivered_at is not None
    assert demo_stats(demo)["cancels"][task.remote_task_id] == 1
    assert TaskPoll.objects.get(task=task).next_poll_at <= timezone.now()
    assert audit(task)[-2:] == ["task.cancel_requested", "task.cancel_delivered"]
    assert follow(task, lambda t: t.is_terminal).status == TaskStatus.CANCELLED


def test_a_cancel_waits_while_the_tool_call_is_under_way(server, operator):
    # (A cancel before the call is sent ends the task at once: tests/test_launch_feedback.py.)
    task = launched(server, operator, "long", {"seconds": 30})
    call = services.mark_launch_sent(task=task)  # the launch job is sending tools/call now
    services.request_cancel(task=task, user=operator)
    with pytest.raises(jobs.LaunchPending):
        run(jobs.cancel)(task.id, last_attempt=False)

    async def send() -> TaskCreated:
        async with TasksClient(server.to_target(), timeout=10) as client:
            return await client.call_tool(call.tool, call.arguments)

    services.record_launch_outcome(task=task, outcome=run(send)())  # what the launch job does with the answer
    assert run(jobs.cancel)(task.id, last_attempt=False) == "delivered"
    assert follow(task, lambda t: t.is_terminal).status == TaskStatus.CANCELLED


def test_a_cancel_during_mrtr_rounds_ends_the_call_here(server, operator, approver):
    task = launched(server, operator, "mrtr")
    run(jobs.launch)(task.id)
    services.request_cancel(task=task, user=operator)
    assert run(jobs.cancel)(task.id) == "cancelled before any server task"
    task = reload(task)
    assert task.status == TaskStatus.CANCELLED and task.finished_at
    assert InputRequest.objects.get(task=task).state == InputRequestState.SUPERSEDED
