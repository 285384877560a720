"""A first tools/call the gateway sends itself (taskhub/gateway/sending.py): marked sent in the launch's transaction,
sent on a kept client, recorded by the worker's services; the launch job as its fallback should the gateway stop; a
refused connection handed to the worker; and where the worker is needed, the gateway does not send."""

from __future__ import annotations

import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from taskhub.audit.models import AuditEvent
from taskhub.gateway import sending
from taskhub.gateway.sending import Sender
from taskhub.gateway.waiting import close_gateway_connections
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import InvalidTransition
from taskhub.tasks.models import Task, TaskPoll, TaskStatus
from taskhub.tasks.services.launching import GATEWAY_FALLBACK_MARGIN_SECONDS
from taskhub.worker import jobs
from tests.catalogue_fixtures import with_tools
from tests.helpers import wait_until
from tests.wire_recorder import WireRecorder
from tests.worker_jobs.job_helpers import jobs_of, reload, run, tool_calls

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]

LAUNCH_JOB = "taskhub.launch_task"


def sent_by_gateway(server, operator, tool: str, arguments: dict, *, answer_within: float = 120) -> Task:
    task, sends = services.launch_sent_by_gateway(
        server=with_tools(server, tool), tool=tool, arguments=arguments, user=operator, answer_within=answer_within
    )
    assert sends
    return task


def actors(task: Task) -> list[tuple[str, str]]:
    rows = AuditEvent.objects.filter(task_id=task.id).order_by("id")
    return [(row.action, row.actor_label or "") for row in rows]


@pytest.fixture
def sender():
    sender = Sender()
    yield sender
    sender.close()
    close_gateway_connections()  # the recording threads' connections, or the test database could not be dropped


def kept_client(sender: Sender, server: Server, *, declares_tasks: bool = True):
    """The first take starts connecting a client; a later one gets it, once it is connected."""
    assert sender.take(server, declares_tasks=declares_tasks) is None
    return wait_until(lambda: sender.take(server, declares_tasks=declares_tasks), what="the gateway's kept client")


def test_the_launch_is_marked_sent_by_the_gateway_and_its_fallback_waits_past_the_calls_timeout(server, operator):
    before = timezone.now()
    task = sent_by_gateway(server, operator, "quick", {"text": "marked"}, answer_within=120)

    assert actors(task) == [("task.launched", "olga"), ("task.launch_sent", "gateway")]
    [job] = jobs_of(LAUNCH_JOB)
    assert (job.status, job.lock, job.args) == ("todo", f"launch:{task.id}", {"task_id": str(task.id)})
    waits = datetime.timedelta(seconds=120 + GATEWAY_FALLBACK_MARGIN_SECONDS)
    assert job.scheduled_at >= before + waits


def test_the_gateways_launch_checks_the_server_it_read_for_the_call_without_reading_it_again(server, operator):
    """Its endpoint read the server a moment before (Endpoint.resolve): a statement less for every call. launch()
    reads a caller's copy again (test_launch_refuses_a_disabled_server); the gateway's is checked as it was read."""
    server = with_tools(server, "quick")
    with CaptureQueriesContext(connection) as statements:
        services.launch_sent_by_gateway(
            server=server, tool="quick", arguments={"text": "read once"}, user=operator, answer_within=120
        )
    assert not [statement for statement in statements if 'FROM "servers_server"' in statement["sql"]]
    # Its two audit rows, the launch and its round marked sent, in one statement.
    assert len([statement for statement in statements if 'INSERT INTO "audit_auditevent"' in statement["sql"]]) == 1

    server.enabled = False  # as read: the launch is refused, and nothing is written
    with pytest.raises(InvalidTransition, match="disabled"):
        services.launch_sent_by_gateway(
            server=server, tool="quick", arguments={"text": "refused"}, user=operator, answer_within=120
        )
    assert not Task.objects.filter(arguments={"text": "refused"}).exists()


def test_should_the_gateway_stop_before_recording_the_fallback_makes_the_outcome_unknown_and_never_resends(
    server, operator, recorder
):
    task = sent_by_gateway(server, operator, "quick", {"text": "gateway stopped"})

    assert run(jobs.launch)(task.id) == "outcome unknown"  # the fallback job, once its time came
    task = reload(task)
    assert task.status == TaskStatus.LAUNCH_UNKNOWN and "never recorded" in task.status_message
    assert tool_calls(recorder, "quick", "gateway stopped") == []


def test_a_fallback_left_by_a_gateway_that_stopped_after_recording_the_outcome_does_nothing(
    server, operator, recorder, monkeypatch
):
    """The fallback is dropped after the outcome commits (record_launch_end): a process that stops in between leaves
    it, and once its time comes it finds the task no longer launching."""
    from taskhub.mcp.client import ToolCompleted
    from taskhub.tasks import hooks

    task = sent_by_gateway(server, operator, "quick", {"text": "recorded, then stopped"})
    monkeypatch.setattr(hooks, "drop_pending_launch", lambda task_id: 0)  # the process stopped before it
    answer = {"content": [{"type": "text", "text": "echo: recorded, then stopped"}], "isError": False}
    services.record_launch_outcome(task=task, outcome=ToolCompleted(result=answer), sent_by_gateway=True)
    assert [job.status for job in jobs_of(LAUNCH_JOB)] == ["todo"]

    assert run(jobs.launch)(task.id) == "not launching"
    task = reload(task)
    assert task.status == TaskStatus.COMPLETED and task.result == answer
    assert tool_calls(recorder, "quick", "recorded, then stopped") == []


def test_on_its_kept_client_the_gateway_sends_once_records_the_outcome_and_drops_the_fallback(
    server, operator, recorder, sender
):
    send = kept_client(sender, with_tools(server, "quick"))
    task = sent_by_gateway(server, operator, "quick", {"text": "sent by the gateway"})

    recorded = sender.send(send, task=task, tools=server.tools).result(timeout=30)

    assert isinstance(recorded, Task) and recorded.status == TaskStatus.COMPLETED
    assert recorded.result["content"][0]["text"] == "echo: sent by the gateway"
    assert reload(task).status == TaskStatus.COMPLETED
    assert len(tool_calls(recorder, "quick", "sent by the gateway")) == 1
    assert actors(task) == [
        ("task.launched", "olga"),
        ("task.launch_sent", "gateway"),
        ("task.launch_answered", "gateway"),
    ]
    # The fallback will not run: dropped once the outcome is committed, after the agent is told.
    wait_until(lambda: [job.status for job in jobs_of(LAUNCH_JOB)] == ["cancelled"], what="the fallback dropped")


def test_a_task_the_server_makes_is_followed_by_the_tracker_as_after_the_workers_send(server, operator, sender):
    send = kept_client(sender, with_tools(server, "progress"))
    task = sent_by_gateway(server, operator, "progress", {"steps": 2, "step_ms": 100})

    sender.send(send, task=task, tools=server.tools).result(timeout=30)

    task = reload(task)
    assert task.status == TaskStatus.WORKING and task.remote_task_id
    assert TaskPoll.objects.get(task=task).next_poll_at <= timezone.now()


@pytest.fixture
def gone_server(demo, operator, sender):
    """A server the gateway's client connected to, gone since (its port refuses connections); (server, send)."""
    proxy = WireRecorder(demo.url).start()
    server = with_tools(create_server(name="gone", transport="http", url=proxy.url, user=None), "quick")
    try:
        send = kept_client(sender, server)
    finally:
        proxy.stop()
    return server, send


def test_a_server_gone_while_the_client_was_idle_is_found_before_sending_and_the_worker_sends_the_call(
    gone_server, operator, sender, monkeypatch
):
    server, send = gone_server
    monkeypatch.setattr(sending, "ASK_AFTER_IDLE_SECONDS", 0.0)  # idle long enough: asked before the call
    task = sent_by_gateway(server, operator, "quick", {"text": "refused"})

    assert sender.send(send, task=task, tools=server.tools).result(timeout=30) is None

    task = reload(task)
    assert task.status == TaskStatus.LAUNCHING and "could not reach the server" in task.status_message
    assert [action for action, _ in actors(task)] == ["task.launched", "task.launch_sent", "task.launch_withdrawn"]
    assert not services.launch_was_sent(task=task)  # so the worker's job sends it, with its retries
    fallback, now = jobs_of(LAUNCH_JOB)
    assert fallback.status == "cancelled"
    assert now.status == "todo" and now.scheduled_at is None
    # The client is given up: the next call goes through the worker while a new one connects.
    assert sender.take(server, declares_tasks=True) is None


def test_once_the_call_may_have_gone_out_a_failure_leaves_its_outcome_unknown_never_resent(
    gone_server, operator, sender, monkeypatch
):
    """The client heard from its server a moment ago, so the call is sent without asking first: whatever then fails, the
    call may have reached the server (a kept connection carries other calls), so it is never sent again."""
    server, send = gone_server
    monkeypatch.setattr(sending, "ASK_AFTER_IDLE_SECONDS", 3600.0)
    task = sent_by_gateway(server, operator, "quick", {"text": "maybe sent"})

    assert sender.send(send, task=task, tools=server.tools).result(timeout=30) is None

    task = reload(task)
    assert task.status == TaskStatus.LAUNCH_UNKNOWN and "no usable answer" in task.status_message
    assert actors(task)[-1] == ("task.launch_unknown", "gateway")
    # Its fallback dropped once the outcome is committed, after the agent is told.
    wait_until(lambda: [job.status for job in jobs_of(LAUNCH_JOB)] == ["cancelled"], what="the fallback dropped")
    assert sender.take(server, declares_tasks=True) is None


@pytest.mark.parametrize(
    "why",
    ["stdio", "oauth", "disabled", "unreachable", "setting off", "past max_concurrent_jobs"],
)
def test_where_the_worker_is_needed_the_gateway_does_not_send(server, settings, sender, why):
    if why == "past max_concurrent_jobs":
        Server.objects.filter(pk=server.pk).update(max_concurrent_jobs=1)
        server.refresh_from_db()
        assert kept_client(sender, server) is not None  # its one call in flight
        assert sender.take(server, declares_tasks=True) is None
        return
    if why == "stdio":
        server = create_server(name="stdio", transport="stdio", command="python", user=None)
    elif why == "oauth":
        server.oauth = True
    elif why == "disabled":
        server.enabled = False
    elif why == "unreachable":
        server.unreachable_since = timezone.now()
    else:
        settings.TASKHUB_GATEWAY_SENDS_CALLS = False
    assert sender.take(server, declares_tasks=True) is None
    assert sender._loop is None  # not even a client was connected for it
