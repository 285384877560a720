"""The queue's priorities: answers and cancels run before the launches queued ahead of them."""

from __future__ import annotations

import pytest

from taskhub.audit.models import AuditEvent
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, TaskStatus
from taskhub.worker import jobs
from tests.stack_fixtures import run_worker_until_idle
from tests.worker_jobs.job_helpers import (
    approval_waiting,
    demo_stats,
    launched,
    reload,
    run,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]


# --- precedence: answers and cancels before launches -----------------------------------------------


@pytest.mark.embedded
def test_an_answer_and_a_cancel_run_before_the_launches_queued_ahead_of_them(server, operator, approver, demo):
    waiting = approval_waiting(server, operator)
    running = launched(server, operator, "long", {"seconds": 30})
    run(jobs.launch)(running.id)
    running = reload(running)
    queued = [launched(server, operator, "quick", {"text": f"queued-{n}"}) for n in range(12)]
    approve = InputRequest.objects.get(task=waiting, key="approve")
    services.answer_input(input_request=approve, response={"action": "decline"}, user=approver)
    services.request_cancel(task=running, user=operator)

    concurrency = 2
    run(run_worker_until_idle)(timeout=60, concurrency=concurrency)

    assert [reload(task).status for task in queued] == [TaskStatus.COMPLETED] * len(queued)
    assert demo_stats(demo)["deliveries"][f"{waiting.remote_task_id}/approve"] == 1
    assert demo_stats(demo)["cancels"][running.remote_task_id] == 1
    trail = AuditEvent.objects.order_by("id")
    delivered = trail.get(task_id=waiting.id, action="input.delivered").id
    cancelled = trail.get(task_id=running.id, action="task.cancel_delivered").id
    sent = trail.filter(task_id__in=[task.id for task in queued], action="task.launch_sent")
    # Both were taken first; only launches started while one of them was on the wire can precede it.
    assert sent.filter(id__lt=max(delivered, cancelled)).count() < concurrency, list(sent.values_list("id", flat=True))
