"""OpenTelemetry traces (taskhub/observability/tracing.py), with an in-memory exporter in the test process.

The approval trace runs the real flow: the approver's POST to the answer view, a real procrastinate worker on its
own connector delivering to the demo server over HTTP (through a recording proxy, which shows the `_meta` the
server received). The poll trace runs a real Tracker against the demo server and a live socket on the ASGI app.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.gateway import sending
from taskhub.gateway.sending import Sender
from taskhub.gateway.waiting import close_gateway_connections
from taskhub.mcp.schema_fields import ELICITATION
from taskhub.observability import tracing
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.approval_fixtures import add_approver_groups
from tests.conftest import PROJECT_DIR
from tests.helpers import wait_until
from tests.stack_fixtures import in_own_thread, run_worker_until_idle, session_cookie_for, worker_environment
from tests.test_tracker import launch_live
from tests.tracker_fixtures import RunningTracker
from tests.wire_recorder import WireRecorder
from tests.worker_jobs.job_helpers import approval_waiting, jobs_of

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]

run = async_to_sync
ANSWER = {"action": "accept", "content": {"approved": True, "reason": "looks good"}}


@pytest.fixture
def spans():
    """Tracing on in this process, every span kept in memory as it ends; off again after the test."""
    exporter = InMemorySpanExporter()
    tracing.configure(exporter, batch=False)
    yield exporter
    tracing.shutdown()


@pytest.fixture(scope="module")
def recorder(shared_demo_server):
    proxy = WireRecorder(shared_demo_server.url).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def server(recorder):
    server = create_server(name="deploys", transport="http", url=recorder.url, user=None)
    add_approver_groups(server, Group.objects.create(name="deployers"))
    return server


def named(exporter: InMemorySpanExporter, name: str) -> list:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def traceparent_of(span) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{span.context.trace_flags:02x}"


def child_of(span, parent) -> bool:
    return span.context.trace_id == parent.context.trace_id and span.parent.span_id == parent.context.span_id


def tasks_update_to(recorder: WireRecorder, task: Task) -> dict:
    [update] = [e for e in recorder.requests("tasks/update") if e.body["params"]["taskId"] == task.remote_task_id]
    return update.body["params"]


def test_an_answer_is_one_trace_from_the_approvers_submit_to_the_servers_tasks_update(spans, server, recorder):
    task = approval_waiting(server, make_user("olga", OPERATORS))
    approve = InputRequest.objects.get(task=task, key="approve")
    spans.clear()
    approver = Client()
    approver.force_login(make_user("abe", APPROVERS, "deployers"))
    fields = {"action": "accept", f"{ELICITATION.html_prefix}approved": "on", f"{ELICITATION.html_prefix}reason": "ok!"}
    assert approver.post(reverse("tasks:answer", args=[approve.pk]), fields).status_code in (200, 302)

    # The submit's context went with the job, in its args (the job runs in another process).
    [submit] = named(spans, "taskhub.answer.submit")
    [job] = jobs_of("taskhub.deliver_answer")
    assert job.args == {
        "input_request_id": approve.pk,
        "server_id": task.server_id,
        "traceparent": traceparent_of(submit),
    }
    run(run_worker_until_idle)()
    approve.refresh_from_db()
    assert approve.state == InputRequestState.DELIVERED

    [delivery] = named(spans, "taskhub.job taskhub.deliver_answer")
    [send] = named(spans, "MCP send tasks/update")
    assert submit.parent is None and child_of(delivery, submit) and child_of(send, delivery)
    # ... and on to the server, in the request's _meta (SEP-414), beside the protocol's own keys.
    meta = tasks_update_to(recorder, task)["_meta"]
    assert meta["traceparent"] == traceparent_of(send)
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"

    ids = {"taskhub.task.id": str(task.id), "taskhub.server.id": server.pk, "taskhub.server.name": "deploys"}
    assert submit.attributes.items() >= {**ids, "taskhub.input_request.id": approve.pk}.items()
    assert submit.attributes["gen_ai.tool.name"] == "approval"
    assert delivery.attributes.items() >= {**ids, "taskhub.job.name": "taskhub.deliver_answer"}.items()
    assert send.attributes["mcp.method.name"] == "tasks/update"
    # Ids and names only: the answer is in no span.
    everything = json.dumps([dict(span.attributes) for span in spans.get_finished_spans()])
    assert "ok!" not in everything and "ship" not in everything


def test_an_answer_the_web_process_sends_itself_is_one_trace_from_the_submit_to_the_servers_tasks_update(
    spans, server, recorder, monkeypatch
):
    """Most answers are sent by the web process on its kept client (sending.answer_and_send), on the sender's loop,
    which does not run in the context of the request that hands it the answer: the context rides on the answer."""
    sender = Sender()
    monkeypatch.setattr(sending, "SENDER", sender)
    try:
        task = approval_waiting(server, make_user("olga", OPERATORS))
        approve = InputRequest.objects.get(task=task, key="approve")
        assert not sender.may_send_answer(server)  # the first look connects the client
        wait_until(lambda: sender.may_send_answer(server), what="the kept client")
        spans.clear()
        approver = Client()
        approver.force_login(make_user("abe", APPROVERS, "deployers"))
        fields = {"action": "accept", f"{ELICITATION.html_prefix}approved": "on"}
        assert approver.post(reverse("tasks:answer", args=[approve.pk]), fields).status_code in (200, 302)
        wait_until(lambda: named(spans, "taskhub.answer.send"), what="the web process's send")
    finally:
        sender.close()
        close_gateway_connections()
    assert InputRequest.objects.get(pk=approve.pk).state == InputRequestState.DELIVERED
    assert jobs_of("taskhub.deliver_answer") == []

    [submit] = named(spans, "taskhub.answer.submit")
    [send] = named(spans, "taskhub.answer.send")
    [update] = named(spans, "MCP send tasks/update")
    assert submit.parent is None and child_of(send, submit) and child_of(update, send)
    assert tasks_update_to(recorder, task)["_meta"]["traceparent"] == traceparent_of(update)
    assert send.attributes.items() >= {"taskhub.task.id": str(task.id), "taskhub.input_request.id": approve.pk}.items()


async def test_a_change_seen_by_a_poll_is_one_trace_to_the_push_on_a_live_socket(
    spans, application, fresh_layer, recorder
):
    operator = await database_sync_to_async(make_user)("olga", OPERATORS)
    server = await database_sync_to_async(create_server)(name="demo", transport="http", url=recorder.url, user=None)
    launch = sync_to_async(in_own_thread, thread_sensitive=False)  # its thread's connection is closed after
    [task] = await launch(launch_live, server=server, tool="progress", arguments={"steps": 2, "step_ms": 300})
    cookie = await database_sync_to_async(session_cookie_for)(operator)
    headers = [(b"host", b"testserver"), (b"origin", b"http://testserver"), (b"cookie", f"sessionid={cookie}".encode())]
    socket = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    assert (await socket.connect())[0]
    await socket.receive_from(timeout=5)  # the counts sent on connect

    running = RunningTracker(worker_id="traced", listen=False).start()
    try:
        async with asyncio.timeout(20):
            while not named(spans, "taskhub.live.push"):
                await socket.receive_from(timeout=20)  # a change pushed to the browser
    finally:
        await sync_to_async(running.stop, thread_sensitive=False)()
        await socket.disconnect()

    pushes = named(spans, "taskhub.live.push")
    publishes = {span.context.span_id: span for span in named(spans, "taskhub.live.publish")}
    polls = {span.context.span_id: span for span in named(spans, "taskhub.tracker.poll")}
    push = pushes[0]
    publish = publishes[push.parent.span_id]
    poll = polls[publish.parent.span_id]
    assert poll.parent is None and child_of(publish, poll) and child_of(push, publish)
    assert poll.attributes.items() >= {"taskhub.task.id": str(task.id), "mcp.method.name": "tasks/get"}.items()
    assert publish.attributes["taskhub.task.id"] == push.attributes["taskhub.task.id"] == str(task.id)
    # The poll's tasks/get (the tracker's lean path, not the SDK) passed the context to the server as well.
    polled = [
        e.body["params"] for e in recorder.requests("tasks/get") if e.body["params"]["taskId"] == task.remote_task_id
    ]
    assert traceparent_of(poll) in [params["_meta"].get("traceparent") for params in polled]


def test_a_change_notified_on_a_subscription_is_one_trace_to_the_live_publish(spans, shared_demo_server):
    server = create_server(name="demo", transport="http", url=shared_demo_server.url, user=None)
    [task] = launch_live(server, "progress", {"steps": 4, "step_ms": 300})

    def published_from_a_notification() -> list:
        notified = {span.context.span_id: span for span in named(spans, "taskhub.tracker.notification")}
        publishes = named(spans, "taskhub.live.publish")
        return [(notified[p.parent.span_id], p) for p in publishes if p.parent and p.parent.span_id in notified]

    with RunningTracker(worker_id="listening", listen=True):
        wait_until(published_from_a_notification, what="a notified change published in its trace")
    notification, publish = published_from_a_notification()[0]
    # A trace of its own, although the subscription was opened from a poll's span.
    assert notification.parent is None and child_of(publish, notification)
    ids = {"taskhub.task.id": str(task.id), "mcp.task.id": task.remote_task_id}
    assert notification.attributes.items() >= ids.items()


def test_unconfigured_nothing_is_set_up_and_no_trace_context_is_carried(server, recorder):
    # A process started as daphne or a worker starts, with nothing about tracing in its environment.
    environment = {
        key: value
        for key, value in worker_environment().items()
        if not key.startswith("OTEL_") and key != "TASKHUB_TRACING"
    }
    code = (
        "import django, json, sys; django.setup(); from opentelemetry import trace; "
        "print(json.dumps(['opentelemetry.sdk' in sys.modules, type(trace.get_tracer_provider()).__name__]))"
    )
    environment["DJANGO_SETTINGS_MODULE"] = "taskhub.settings"
    started = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_DIR, env=environment, capture_output=True, text=True, check=True
    )
    assert json.loads(started.stdout.splitlines()[-1]) == [False, "ProxyTracerProvider"]

    # In this process tracing is off too (other tests turn it on and off again): a real answer carries nothing.
    assert not tracing.enabled()
    task = approval_waiting(server, make_user("olga", OPERATORS))
    approve = InputRequest.objects.get(task=task, key="approve")
    services.answer_input(input_request=approve, response=ANSWER, user=make_user("abe", APPROVERS, "deployers"))
    [job] = jobs_of("taskhub.deliver_answer")
    assert job.args == {"input_request_id": approve.pk, "server_id": task.server_id}
    run(run_worker_until_idle)()
    meta = tasks_update_to(recorder, task)["_meta"]
    assert "io.modelcontextprotocol/protocolVersion" in meta and "traceparent" not in meta and "tracestate" not in meta

    # A job deferred by a process that traces still runs in one that does not: the context is set aside.
    context = SimpleNamespace(job=SimpleNamespace(id=None, attempts=0, task_name="taskhub.deliver_answer"))
    carried = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert run(jobs.deliver_answer.func)(context, input_request_id=approve.pk, **carried) == "nothing to deliver"


def test_tracing_is_turned_on_by_the_environment_only(monkeypatch):
    try:
        assert tracing.configure_from_environment({}) is None
        assert (
            tracing.configure_from_environment({"TASKHUB_TRACING": "off", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}) is None
        )
        assert tracing.configure_from_environment({"TASKHUB_TRACING": "console", "OTEL_SDK_DISABLED": "true"}) is None
        assert not tracing.enabled()
        with pytest.raises(tracing.TracingMisconfigured, match="TASKHUB_TRACING='jaeger'"):
            tracing.configure_from_environment({"TASKHUB_TRACING": "jaeger"})
        # OTLP without the exporter installed (the `otlp` extra): a clear refusal at startup, not tracing half on.
        monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
        with pytest.raises(tracing.TracingMisconfigured, match="otlp"):
            tracing.configure_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
        assert not tracing.enabled()
        assert tracing.configure_from_environment({"TASKHUB_TRACING": "console"}) == "console"
        assert tracing.enabled()
    finally:
        tracing.shutdown()


def test_a_trace_context_from_a_job_row_or_a_message_is_used_only_when_well_formed(spans):
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    @tracing.traced("probe", parent=lambda message: message)
    def handle(message):
        return tracing.carrier()

    for hostile in ({"traceparent": "garbage"}, {"traceparent": good + "x" * 600}, {"traceparent": 7}, None, []):
        assert handle(hostile)["traceparent"][3:35] != "4bf92f3577b34da6a3ce929d0e0e4736"  # a trace of its own
    assert handle({"traceparent": good})["traceparent"][3:35] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert len(named(spans, "probe")) == 6
