"""Issue 15 item 3, launch feedback: a launch to a server that is down says which attempt failed, why and when it
tries again (task page, list, home), counts against the server's health, and a cancel while it is still launching
ends it as cancelled, not sent. The launch job runs for real against a server that is down, then up (the demo
server started on the port the task's server points at). The browser side: tests/browser/test_launch_feedback.py.
"""

import logging

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.dashboard import dashboard
from taskhub.tasks.models import CANCELLED_NOT_SENT, LAUNCH_ATTEMPTS, LAUNCH_ERROR_MAX_CHARS, Task, TaskStatus
from taskhub.tasks.queries import Needs, needs_filter
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.helpers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]

run = async_to_sync


@pytest.fixture
def olga():
    return make_user("olga", OPERATORS)


@pytest.fixture
def port():
    return free_port()


@pytest.fixture
def down(port):
    """A server nothing listens for yet: the demo server comes up on its port when a test starts it."""
    return with_tools(
        create_server(name="flaky", transport="http", url=f"http://127.0.0.1:{port}/mcp", user=None), "quick"
    )


def launched(server, user, text: str) -> Task:
    return services.launch(server=server, tool="quick", arguments={"text": text}, user=user)


def attempt(task: Task, attempts_before: int) -> jobs.ServerUnreachable:
    """One attempt of the launch job that cannot reach the server: it records itself and asks to be retried."""
    with pytest.raises(jobs.ServerUnreachable) as raised:
        run(jobs.launch)(task.id, last_attempt=False, attempts_before=attempts_before)
    return raised.value


def reload(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def actions(task: Task) -> list[str]:
    return list(AuditEvent.objects.filter(task_id=task.id).order_by("id").values_list("action", flat=True))


def test_a_launch_to_a_server_down_then_up_shows_each_attempt_then_launches(client, olga, down, port, caplog):
    task = launched(down, olga, "down then up")

    with caplog.at_level(logging.WARNING, logger="taskhub.worker.jobs"):
        first = attempt(task, 0)
        second = attempt(task, 1)
    assert f"task {task.id}: attempt 2 of {LAUNCH_ATTEMPTS} could not reach server {down.pk}" in caplog.text
    task = reload(task)
    assert task.status == TaskStatus.LAUNCHING and task.launch_retrying
    assert (task.launch_attempts, task.launch_next_try_at) == (2, second.retry_at)
    assert second.retry_at > first.retry_at
    assert task.launch_last_error  # the transport's words
    retries = AuditEvent.objects.filter(task_id=task.id, action="task.launch_retrying").order_by("id")
    assert [(e.data["attempt"], e.data["of"]) for e in retries] == [(1, LAUNCH_ATTEMPTS), (2, LAUNCH_ATTEMPTS)]
    assert "task.launch_sent" not in actions(task)

    # the task page and the list say so; the home counts it as retrying
    client.force_login(olga)
    line = f"attempt 2 of {LAUNCH_ATTEMPTS} · last error:"
    assert line in client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert line in client.get(reverse("tasks:list")).content.decode()
    assert list(Task.objects.filter(needs_filter(Needs.LAUNCH_RETRYING))) == [task]
    _, secret = create_token(user=olga, name="tests")
    body = Client(headers={"Authorization": f"Bearer {secret}"}).get(f"/api/tasks/{task.pk}").json()
    assert (body["status"], body["launch_attempts"], body["launch_last_error"]) == (
        "launching",
        2,
        task.launch_last_error,
    )
    assert body["launch_next_try_at"]
    board = dashboard(olga)
    assert {item.kind: item.count for item in board.attention}[Needs.LAUNCH_RETRYING] == 1

    # the server's health: unreachable since the first failed attempt, on the servers page and the home's card
    server = Server.objects.get(pk=down.pk)
    assert server.unreachable_since is not None and server.last_error.startswith("A launch could not reach it")
    admin = make_user("ada", ADMINS)
    client.force_login(admin)
    assert "unreachable since" in client.get(reverse("servers:list")).content.decode()
    assert [troubled.server.name for troubled in dashboard(admin).servers] == ["flaky"]

    with DemoServer(port=port):
        assert run(jobs.launch)(task.id, last_attempt=False, attempts_before=2) == "ToolCompleted"
    task = reload(task)
    assert task.status == TaskStatus.COMPLETED and task.result["content"][0]["text"] == "echo: down then up"
    assert (task.launch_attempts, task.launch_last_error, task.launch_next_try_at) == (0, "", None)
    assert not Task.objects.filter(needs_filter(Needs.LAUNCH_RETRYING)).exists()
    assert Server.objects.get(pk=down.pk).unreachable_since is None  # the launch reached it: the outage is over
    assert AuditEvent.objects.filter(server_id=down.pk, action="server.reachable").count() == 1


def test_the_last_attempt_fails_the_launch_as_never_sent_and_counts_against_the_server(olga, down):
    task = launched(down, olga, "never up")
    attempt(task, 0)
    assert run(jobs.launch)(task.id, last_attempt=True, attempts_before=LAUNCH_ATTEMPTS - 1) == "not sent"
    task = reload(task)
    assert task.status == TaskStatus.FAILED and not task.launch_retrying
    assert task.launch_attempts == 2 and task.launch_next_try_at is None
    assert Server.objects.get(pk=down.pk).unreachable_since is not None


def test_a_long_hostile_error_is_stored_capped_and_shown_escaped_without_credentials(client, olga, down):
    task = launched(down, olga, "capped")
    error = "connecting to https://bob:hunter2@example.com/mcp failed: <script>x()</script>" + "<b>x</b>" * 1000
    services.record_launch_retry(task=task, attempt=1, error=error, next_try_at=None)
    task = reload(task)
    assert len(task.launch_last_error) == LAUNCH_ERROR_MAX_CHARS and "<script>x()</script>" in task.launch_last_error
    assert "hunter2" not in task.launch_last_error and "hunter2" not in Server.objects.get(pk=down.pk).last_error
    client.force_login(olga)
    page = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "&lt;script&gt;x()&lt;/script&gt;" in page and "<script>x()" not in page
    assert "trying again now" in page  # no next try time known


def test_a_cancel_while_retrying_ends_the_task_not_sent_and_stops_its_retries(client, olga, down, port):
    task = launched(down, olga, "cancelled while down")
    attempt(task, 0)
    [launch_job] = ProcrastinateJob.objects.filter(task_name="taskhub.launch_task")
    assert launch_job.status == "todo"

    services.request_cancel(task=task, user=olga)
    task = reload(task)
    assert task.status == TaskStatus.CANCELLED and task.finished_at and task.status_message == ""
    assert ProcrastinateJob.objects.get(pk=launch_job.pk).status == "cancelled"  # its retry will not run
    assert not ProcrastinateJob.objects.filter(task_name="taskhub.deliver_cancel").exists()  # nobody to tell
    changed = AuditEvent.objects.get(task_id=task.id, action="task.status_changed")
    assert (changed.data["to"], changed.data["source"], changed.data["sent"]) == (
        "cancelled",
        CANCELLED_NOT_SENT,
        False,
    )
    assert actions(task)[-2:] == ["task.cancel_requested", "task.status_changed"]
    client.force_login(olga)
    page = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "Cancelled, not sent" in page and "The server has sent no status message." in page

    # an attempt that was already running (or a stray run of the job) finds it cancelled: nothing goes out
    with DemoServer(port=port):
        assert run(jobs.launch)(task.id, last_attempt=False, attempts_before=1) == "not launching"
    assert services.mark_launch_sent(task=task) is None
    assert not services.record_launch_retry(task=task, attempt=2, error="late", next_try_at=None)
    assert "task.launch_sent" not in actions(task)
    assert reload(task).status == TaskStatus.CANCELLED


def test_a_cancel_while_the_call_may_be_under_way_waits_for_its_outcome_and_never_resends(olga, down):
    # The launch job wrote its marker (under the task's lock) and may be sending tools/call right now.
    task = launched(down, olga, "in flight")
    assert services.mark_launch_sent(task=task) is not None

    services.request_cancel(task=task, user=olga)
    task = reload(task)
    assert task.status == TaskStatus.LAUNCHING and task.cancel_requested_at  # recorded, not decided here
    assert ProcrastinateJob.objects.filter(task_name="taskhub.deliver_cancel", status="todo").exists()
    with pytest.raises(jobs.LaunchPending):
        run(jobs.cancel)(task.id, last_attempt=False)

    # that attempt's worker died: the next run finds the marker, and the outcome stays unknown, not resent
    assert run(jobs.launch)(task.id) == "outcome unknown"
    assert reload(task).status == TaskStatus.LAUNCH_UNKNOWN
    assert run(jobs.cancel)(task.id, last_attempt=False) == "no remote task"
    assert reload(task).status == TaskStatus.LAUNCH_UNKNOWN
    assert actions(task).count("task.launch_sent") == 1
