"""A task of a stdio server whose process exited (issue 13): `lost`, with the message, never `expired` while its TTL
runs, and the task page does not contradict it. The tracker and the worker's stdio processes that decide it are
exercised in real processes by tests/test_stdio_workers.py; here the service and the page."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from taskhub.accounts.groups import OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import TERMINAL_STATUSES, InputRequest, InputRequestState, Task, TaskPoll, TaskStatus
from taskhub.tasks.queries import OTHER_STATUSES
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot

pytestmark = pytest.mark.django_db

QUESTION = {"method": "elicitation/create", "params": {"message": "Go on?", "requestedSchema": {"type": "object"}}}


@pytest.fixture
def operator():
    return make_user("olga", OPERATORS)


@pytest.fixture
def sent(operator):
    """A task sent to a stdio server (its launch marker written), which made it a durable task asking for input."""
    server = create_server(name="stdio demo", transport="stdio", command="demo-server", user=None)
    with_tools(server, "approval")
    task = services.launch(server=server, tool="approval", arguments={}, user=operator)
    assert services.mark_launch_sent(task=task) is not None
    created = snapshot(
        "input_required", ttl_ms=3_600_000, created_at=timezone.now().isoformat(), inputRequests={"q": QUESTION}
    )
    services.record_launch_outcome(task=task, outcome=TaskCreated(task=created))
    return Task.objects.get(pk=task.pk)


def test_a_task_sent_to_an_earlier_process_is_lost_with_the_message(sent):
    assert TaskPoll.objects.filter(task=sent).exists()
    assert services.mark_lost(task=sent, process_started_at=timezone.now(), exit_detail="killed by SIGKILL")
    task = Task.objects.get(pk=sent.pk)
    assert task.status == TaskStatus.LOST and task.is_terminal and task.finished_at is not None
    assert task.status_message == "the server process that held this task exited"
    assert not TaskPoll.objects.filter(task=task).exists()
    assert InputRequest.objects.get(task=task).state == InputRequestState.SUPERSEDED
    (event,) = AuditEvent.objects.filter(task_id=task.pk, action="task.lost")
    assert event.data["from"] == "input_required" and event.data["exit"] == "killed by SIGKILL"
    assert not services.mark_lost(task=task, process_started_at=timezone.now()), "once"


def test_a_task_the_current_process_was_sent_is_not_lost(sent):
    started_before_the_launch = timezone.now() - timedelta(hours=1)
    assert not services.mark_lost(task=sent, process_started_at=started_before_the_launch)
    assert Task.objects.get(pk=sent.pk).status == TaskStatus.INPUT_REQUIRED


def test_lost_is_final_and_among_taskhubs_own_states():
    assert TaskStatus.LOST in TERMINAL_STATUSES and TaskStatus.LOST in OTHER_STATUSES


def test_the_page_of_a_lost_task_says_lost_and_no_expiry_to_come(client, operator, sent):
    services.mark_lost(task=sent, process_started_at=timezone.now())
    client.force_login(operator)
    html = client.get(reverse("tasks:detail", args=[sent.pk])).content.decode()
    assert "the server process that held this task exited" in html
    assert "task lost: the server process or session that held it is gone" in html  # the timeline's entry
    assert ">lost<" in html
    assert "1 h" in html and "expires" not in html  # the TTL, but no "expires in 59 minutes" beside a final status


def test_a_live_task_still_shows_when_it_expires(client, operator, sent):
    client.force_login(operator)
    html = client.get(reverse("tasks:detail", args=[sent.pk])).content.decode()
    assert "expires" in html
