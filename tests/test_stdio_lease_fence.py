"""Issue 30, item 4: a stdio server's jobs are fenced in SQL, not only in the worker's memory. The statement that
locks a task to record its launch as sent also checks that the sending worker still holds the lease of the
server's process (owner and expiry), so a worker paused past its lease cannot launch on a process that another
worker is about to replace."""

import datetime

import pytest
from django.utils import timezone

from taskhub.audit.models import AuditEvent
from taskhub.servers.models import ServerProcess
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import LeaseLost
from taskhub.tasks.models import Task, TaskStatus
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
