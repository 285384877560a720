"""Issue 30, item 4: a stdio server's jobs are fenced in SQL, not only in the worker's memory. The statement that
locks a task to record its launch as sent, and the one that claims an answer's delivery, also check that the sending
worker still holds the lease of the server's process (owner and expiry), so a worker paused past its lease cannot
launch or answer on a process that another worker is about to replace; the cancel job asks the same just before it
sends."""

import datetime

import pytest
from django.db import connection
from django.utils import timezone

from taskhub.audit.models import AuditEvent
from taskhub.servers.hooks import job_queue
from taskhub.servers.models import ServerProcess
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import LeaseLost
from taskhub.tasks.models import TASK_PHASE, InputRequest, InputRequestState, Task, TaskStatus
from taskhub.worker.stdio import NotOwner
from tests.catalogue_fixtures import with_tools

pytestmark = pytest.mark.django_db


@pytest.fixture
def launching():
    server = create_server(name="local tool", transport="stdio", command="local-mcp-server", user=None)
    return services.launch(server=with_tools(server, "work"), tool="work", arguments={}, user=None)


def lease(task: Task, *, owner: str, expires_in: datetime.timedelta) -> None:
    ServerProcess.objects.update_or_create(
        server_id=task.server_id, defaults={"lease_owner": owner, "lease_expires_at": timezone.now() + expires_in}
    )


def sent_markers(task: Task) -> int:
    return AuditEvent.objects.filter(task=task, action="task.launch_sent").count()


def test_a_worker_whose_lease_expired_cannot_record_a_launch_as_sent(launching):
    lease(launching, owner="worker-a", expires_in=-datetime.timedelta(seconds=1))  # paused past its lease
    with pytest.raises(LeaseLost, match="worker-a no longer holds the lease"):
        services.mark_launch_sent(task=launching, lease_owner="worker-a")
    assert sent_markers(launching) == 0 and Task.objects.get(pk=launching.pk).status == TaskStatus.LAUNCHING


def test_a_worker_whose_lease_was_taken_over_cannot_record_a_launch_as_sent(launching):
    lease(launching, owner="worker-b", expires_in=datetime.timedelta(seconds=30))
    with pytest.raises(LeaseLost):
        services.mark_launch_sent(task=launching, lease_owner="worker-a")
    assert sent_markers(launching) == 0


def test_the_worker_holding_the_lease_records_the_launch_and_sends(launching):
    lease(launching, owner="worker-a", expires_in=datetime.timedelta(seconds=30))
    call = services.mark_launch_sent(task=launching, lease_owner="worker-a")
    assert call is not None and call.tool == "work" and sent_markers(launching) == 1


# --- answers and cancels -----------------------------------------------------------------------------------------


@pytest.fixture
def answered(launching):
    Task.objects.filter(pk=launching.pk).update(status=TaskStatus.INPUT_REQUIRED, remote_task_id="remote-1")
    return InputRequest.objects.create(
        task_id=launching.pk,
        key="confirm",
        method="elicitation/create",
        params={"message": "go?"},
        mrtr_round=TASK_PHASE,
        state=InputRequestState.ANSWERED,
        answer={"action": "accept", "content": {}},
    )


def first_claim_row(answered: InputRequest, *, lease_owner: str):
    sql, params = services.first_claim(input_request_id=answered.pk, attempted_by=lease_owner, lease_owner=lease_owner)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def attempted(answered: InputRequest):
    return InputRequest.objects.get(pk=answered.pk).delivery_attempted_at


def test_a_worker_whose_lease_expired_cannot_claim_an_answers_delivery(answered):
    lease(answered.task, owner="worker-a", expires_in=-datetime.timedelta(seconds=1))
    assert first_claim_row(answered, lease_owner="worker-a") is None  # the delivery job's one statement
    with pytest.raises(LeaseLost, match="worker-a no longer holds the lease"):
        services.claim_delivery(input_request=answered, attempted_by="worker-a", lease_owner="worker-a")
    assert attempted(answered) is None


def test_a_worker_whose_lease_was_taken_over_cannot_claim_an_answers_delivery(answered):
    lease(answered.task, owner="worker-b", expires_in=datetime.timedelta(seconds=30))
    assert first_claim_row(answered, lease_owner="worker-a") is None
    with pytest.raises(LeaseLost):
        services.claim_delivery(input_request=answered, attempted_by="worker-a", lease_owner="worker-a")
    assert attempted(answered) is None


def test_the_worker_holding_the_lease_claims_the_delivery(answered):
    lease(answered.task, owner="worker-a", expires_in=datetime.timedelta(seconds=30))
    claimed = services.first_claimed(first_claim_row(answered, lease_owner="worker-a"))
    assert claimed.pk == answered.pk and claimed.task.server.transport == "stdio"
    assert attempted(answered) is not None


def test_the_cancel_job_checks_the_lease_before_it_sends(answered):
    lease(answered.task, owner="worker-b", expires_in=datetime.timedelta(seconds=30))
    with pytest.raises(LeaseLost) as lost:
        services.check_lease(server_id=answered.task.server_id, lease_owner="worker-a")
    assert NotOwner(lost=lost.value).queue == job_queue(answered.task.server)
    services.check_lease(server_id=answered.task.server_id, lease_owner="worker-b")
