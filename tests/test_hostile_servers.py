"""The real tracker and jobs against hostile MCP servers (tests/hostile_server.py) over real HTTP.

Every bad answer must end up as a `task.protocol_error` on the task's timeline, the worker must neither
crash nor stall (a healthy control task on the same server and one on another server keep
progressing), and the database invariants hold: a terminal task never changes, an input request key is
answered at most once and an answered request is never reopened.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from taskhub.audit.models import AuditEvent
from taskhub.mcp.lean import MAX_RESPONSE_BYTES
from taskhub.tasks import services
from taskhub.tasks.models import (
    STATUS_MESSAGE_MAX_CHARS,
    TRUNCATION_NOTE,
    InputRequest,
    InputRequestState,
    Task,
    TaskPoll,
    TaskStatus,
)
from taskhub.worker import jobs
from tests.catalogue_fixtures import with_tools
from tests.helpers import wait_until
from tests.hostile_fixtures import Control, followed, new_remote_id, protocol_errors, register
from tests.hostile_server import Drip, Error, HostileServer, Raw, Reset, Result, working
from tests.tracker_fixtures import RunningTracker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REQUEST_TIMEOUT = 1.5
TRACKER_OPTIONS = {
    "request_timeout": REQUEST_TIMEOUT,
    "backoff_base_seconds": 0.2,
    "backoff_cap_seconds": 1.0,
    "listen": False,
}
TEN_MB = 10 * 1024 * 1024


SSE = "text/event-stream"


def sse(data: bytes) -> bytes:
    return b"event: message\ndata: " + data + b"\n\n"


def reply(request_id, result: bytes) -> bytes:
    """A JSON-RPC response around `result`, exactly these bytes."""
    return b'{"jsonrpc": "2.0", "id": ' + json.dumps(request_id).encode() + b', "result": ' + result + b"}"


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with HostileServer() as server:
        yield server


@pytest.fixture(scope="module")
def bystander() -> Iterator[HostileServer]:
    """Another server, healthy for these tests: its task must keep moving whatever the first one does."""
    with HostileServer() as server:
        yield server


def trail(task: Task) -> list[str]:
    return list(AuditEvent.objects.filter(task_id=task.pk).order_by("id").values_list("action", flat=True))


@pytest.fixture
def stage(hostile, bystander):
    """Both servers registered, a control task on each, and one tracker following them all."""
    server, other = register(hostile), register(bystander)
    controls = [Control(hostile, server), Control(bystander, other)]
    with RunningTracker(worker_id=f"hostile-{uuid.uuid4().hex[:6]}", **TRACKER_OPTIONS) as running:
        yield server, controls
        for control in controls:
            control.assert_progressing()
        assert running.tracker.stats.polls > 0


# --- tasks/get: one bad answer after another --------------------------------------------------------------

BAD_ANSWERS = {
    "invalid JSON": (lambda rid: Raw(b'{"jsonrpc": "2.0", "id": 1, "result": {"taskId": '), "not a JSON-RPC response"),
    "an HTML error page": (lambda rid: Raw(b"<h1>oops</h1>", "text/html"), "not a JSON-RPC response"),
    "a JSON array": (lambda rid: Raw(b"[1, 2, 3]"), "not a JSON-RPC response"),
    "a result that is not an object": (lambda rid: Result("working"), "expected an object"),
    "a status message that is a number": (lambda rid: Result(working(rid, statusMessage=42)), "statusMessage"),
    "a status that is a list": (lambda rid: Result(working(rid, status=["working"])), "unknown task status"),
    "an unknown status": (lambda rid: Result(working(rid, status="paused")), "unknown task status 'paused'"),
    "input_required without requests": (lambda rid: Result(working(rid, status="input_required")), "without"),
    "inputRequests that is a list": (
        lambda rid: Result(working(rid, status="input_required", inputRequests=[{"method": "x"}])),
        "inputRequests",
    ),
    "an input request that is a string": (
        lambda rid: Result(working(rid, status="input_required", inputRequests={"k": "please"})),
        "inputRequests.k",
    ),
    "a task handle": (lambda rid: Result({**working(rid), "resultType": "task"}), "only for tools/call"),
    "a tool result": (
        lambda rid: Result({"content": [{"type": "text", "text": "hi"}], "isError": False}),
        "unknown task status None",
    ),
    "an unknown resultType": (lambda rid: Result({**working(rid), "resultType": "later"}), "unknown resultType"),
    "a snapshot of another task": (lambda rid: Result(working("somebody-else")), "another task"),
    "a reply under another JSON-RPC id": (
        lambda rid: Raw(lambda request_id: reply(f"not-{request_id}", json.dumps(working(rid)).encode())),
        "is not the request's",
    ),
    "an event stream answering another JSON-RPC id": (
        lambda rid: Raw(lambda request_id: sse(reply(f"not-{request_id}", json.dumps(working(rid)).encode())), SSE),
        "is not the request's",
    ),
    "a completed task without result": (lambda rid: Result(working(rid, status="completed")), "without result"),
    "a JSON string": (lambda rid: Raw(b'"working"'), "not a JSON-RPC response"),
    "an object that is not JSON-RPC": (lambda rid: Raw(b'{"hello": "world"}'), "not a JSON-RPC response"),
    "invalid UTF-8": (
        lambda rid: Raw(lambda request_id: reply(request_id, b'{"taskId": "' + rid.encode() + b'\xff\xfe"}')),
        "not a JSON-RPC response",
    ),
    "absurd nesting": (
        lambda rid: Raw(lambda request_id: reply(request_id, b"[" * 100_000 + b"]" * 100_000)),
        "not a JSON-RPC response",
    ),
    "a malformed JSON-RPC error": (lambda rid: Error("boom"), "malformed JSON-RPC error"),
    "a JSON-RPC error": (lambda rid: Error({"code": -32000, "message": "x" * 100_000}), "xxxx"),
    "a 10 MB status message": (
        lambda rid: Result(working(rid, statusMessage="x" * TEN_MB)),
        f"larger than {MAX_RESPONSE_BYTES} bytes",
    ),
    "a createdAt far too long": (lambda rid: Result(working(rid, createdAt="2" * 5000)), "createdAt"),
    "an input request key far too long": (
        lambda rid: Result(
            working(rid, status="input_required", inputRequests={"k" * 5000: {"method": "elicitation/create"}})
        ),
        "key",
    ),
    "an input request method far too long": (
        lambda rid: Result(working(rid, status="input_required", inputRequests={"k": {"method": "m" * 5000}})),
        "method",
    ),
    "a task id far too long": (lambda rid: Result(working(rid + "x" * 5000)), "taskId is longer"),
    "a key with a NUL character": (
        lambda rid: Result(working(rid, status="input_required", inputRequests={"k\u0000": {"method": "m"}})),
        "NUL",
    ),
    "a body that trickles slower than the timeout": (lambda rid: Drip(working(rid), tick=0.1), "within"),
    "a connection reset mid-body": (lambda rid: Reset(working(rid, statusMessage="y" * 50_000)), "broke off"),
}


@pytest.mark.parametrize("case", list(BAD_ANSWERS))
def test_a_bad_answer_is_a_protocol_error_and_nothing_else_changes(stage, hostile, case):
    server, controls = stage
    make_answer, expected = BAD_ANSWERS[case]
    remote = new_remote_id("bad")
    hostile.script(remote, Result(working(remote, statusMessage="fine so far")), make_answer(remote))
    task = followed(server, remote)
    wait_until(lambda: protocol_errors(task), timeout=20, what="the protocol error on the timeline")

    problem = json.dumps(protocol_errors(task)[0])
    assert expected in problem
    assert len(problem) < 2000, "a problem note is short whatever the server sent"
    for control in controls:
        control.assert_progressing()
    wait_until(lambda: hostile.polls[remote] >= 4, timeout=20, what="the task polled again after backing off")
    stored = Task.objects.get(pk=task.pk)
    assert (stored.status, stored.status_message, stored.result) == (TaskStatus.WORKING, "fine so far", None)
    assert not InputRequest.objects.filter(task=task).exists()
    assert len(protocol_errors(task)) == 1, "the same problem in a row is recorded once"
    server.refresh_from_db()
    assert server.unreachable_since is None, "a bad answer is not an outage: the server answered"


def test_a_bad_answer_then_a_good_one_and_the_task_goes_on(stage, hostile):
    server, _ = stage
    remote = new_remote_id("recovers")
    hostile.script(remote, Raw(b"not json"), Result(working(remote, status="completed", result={"content": []})))
    task = followed(server, remote)
    wait_until(lambda: Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED, what="the task completed")
    assert "task.protocol_error" in trail(task)
    assert trail(task)[-1] == "task.status_changed"


# --- sizes --------------------------------------------------------------------------------------------------


def test_a_long_status_message_under_the_body_cap_is_stored_truncated_with_a_note(stage, hostile):
    server, _ = stage
    remote = new_remote_id("long")
    hostile.script(remote, Result(working(remote, statusMessage="z" * 3_000_000)))
    task = followed(server, remote)
    wait_until(lambda: Task.objects.get(pk=task.pk).status_message.startswith("z"), what="the message stored")
    message = Task.objects.get(pk=task.pk).status_message
    assert len(message) == STATUS_MESSAGE_MAX_CHARS and message.endswith(TRUNCATION_NOTE)


def test_nul_characters_and_lone_surrogates_are_stored_replaced(stage, hostile):
    server, _ = stage
    remote = new_remote_id("nul")
    # Valid JSON, but Postgres text and jsonb refuse U+0000, and UTF-8 has no lone surrogates.
    result = {"content": [{"type": "text", "text": "x\u0000y"}], "k\u0000\udc00": "\ud800"}
    hostile.script(remote, Result(working(remote, status="completed", statusMessage="a\u0000b\ud800c", result=result)))
    task = followed(server, remote)
    wait_until(lambda: Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED, what="the task completed")
    stored = Task.objects.get(pk=task.pk)
    assert stored.status_message == "a\ufffdb\ufffdc"
    assert stored.result == {"content": [{"type": "text", "text": "x\ufffdy"}], "k\ufffd\ufffd": "\ufffd"}


# --- terminal, input requests ---------------------------------------------------------------------------------


def test_a_terminal_task_never_changes_even_when_the_server_takes_it_back(stage, hostile):
    server, _ = stage
    remote = new_remote_id("undead")
    done = working(remote, status="completed", result={"content": [{"type": "text", "text": "done"}]})
    hostile.script(remote, Result(done), Result(working(remote, statusMessage="back to work")))
    task = followed(server, remote)
    wait_until(lambda: Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED, what="the task completed")
    before = Task.objects.values().get(pk=task.pk)
    # A stale poll row (a lagging worker, a lost delete) makes the tracker ask once more.
    TaskPoll.objects.create(task_id=task.pk, next_poll_at=before["finished_at"])
    wait_until(lambda: protocol_errors(task), what="the contradiction on the timeline")
    assert "which is final" in protocol_errors(task)[0]["problem"]
    after = Task.objects.values().get(pk=task.pk)
    assert {k: v for k, v in after.items() if k != "updated_at"} == {
        k: v for k, v in before.items() if k != "updated_at"
    }


def test_a_result_on_a_working_task_is_not_stored(stage, hostile):
    server, _ = stage
    remote = new_remote_id("early-result")
    hostile.script(remote, Result(working(remote, result={"content": [{"type": "text", "text": "too soon"}]})))
    task = followed(server, remote)
    wait_until(lambda: protocol_errors(task), what="the protocol error on the timeline")
    assert "result" in json.dumps(protocol_errors(task))
    assert Task.objects.get(pk=task.pk).result is None


def asking(remote: str, **requests) -> dict:
    return working(remote, status="input_required", inputRequests=requests)


CONFIRM = {
    "method": "elicitation/create",
    "params": {"mode": "form", "message": "Go?", "requestedSchema": {"type": "object", "properties": {}}},
}


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"method": "elicitation/create", "params": "go on"}, "params"),
        ({"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": "yes"}}, "schema"),
        ({"method": "elicitation/create", "params": {"requestedSchema": {"properties": ["a"]}}}, "properties"),
        (
            {"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": {"type": "string"}}},
            "object",
        ),
    ],
)
def test_an_input_request_with_broken_params_is_opened_and_noted(stage, hostile, request_, expected):
    server, _ = stage
    remote = new_remote_id("broken-params")
    hostile.script(remote, Result(asking(remote, k=request_)))
    task = followed(server, remote)
    wait_until(lambda: protocol_errors(task), what="the protocol error on the timeline")
    assert expected in json.dumps(protocol_errors(task))
    # Opened all the same, so that an approver can decline or cancel it and the task can move on.
    assert InputRequest.objects.get(task=task).state == InputRequestState.OPEN


def test_a_key_asked_again_after_its_answer_is_never_reopened_nor_answered_twice(stage, hostile, django_user_model):
    server, _ = stage
    approver = django_user_model.objects.create_user(f"abe-{uuid.uuid4().hex[:6]}")
    remote = new_remote_id("reuse")
    hostile.script(remote, Result(asking(remote, k=CONFIRM)))
    task = followed(server, remote)
    wait_until(lambda: InputRequest.objects.filter(task=task).exists(), what="the request opened")
    request = InputRequest.objects.get(task=task)
    services.answer_input(input_request=request, response={"action": "accept", "content": {}}, user=approver)
    assert async_to_sync(jobs.deliver)(request.pk) == "delivered"
    assert hostile.updates.count((remote, {"k": {"action": "accept", "content": {}}})) == 1
    # The server lists the answered key again (a key reused after its answer).
    wait_until(lambda: protocol_errors(task), what="the reused key on the timeline")
    assert "k" in json.dumps(protocol_errors(task)) and "again" in json.dumps(protocol_errors(task))
    assert list(InputRequest.objects.filter(task=task).values_list("state", flat=True)) == ["delivered"]
    # A second delivery job (a duplicate) sends nothing.
    assert async_to_sync(jobs.deliver)(request.pk) == "nothing to deliver"
    assert [update for update in hostile.updates if update[0] == remote] == [
        (remote, {"k": {"action": "accept", "content": {}}})
    ]


# --- tools/call (the launch job) -------------------------------------------------------------------------------

HANDLE = {"resultType": "task", "taskId": "t", "status": "working"}
BAD_LAUNCH_ANSWERS = {
    "invalid JSON": (Raw(b'{"jsonrpc": "2.0", "id": '), "unusable"),
    "an unknown status": (Result({**HANDLE, "status": "paused"}), "unknown task status"),
    "an unknown resultType": (Result({"resultType": "eventually"}), "unknown resultType"),
    "a task id far too long": (Result({**HANDLE, "taskId": "t" * 5000}), "taskId is longer"),
    "a connection reset mid-body": (Reset({**HANDLE, "x": "y" * 50_000}), "tools/call"),
    "a 10 MB answer": (Result({**HANDLE, "statusMessage": "x" * TEN_MB}), f"larger than {MAX_RESPONSE_BYTES} bytes"),
    "a body that trickles slower than the timeout": (Drip(HANDLE), "no answer within"),
    "a tool result of the wrong shape": (Result({"resultType": "complete", "content": "no list"}), "malformed"),
    "an MRTR key far too long": (Result({"resultType": "input_required", "inputRequests": {"k" * 600: {}}}), "key"),
}


@pytest.fixture
def fast_launch(settings):
    settings.TASKHUB_LAUNCH_TIMEOUT_SECONDS = 3.0


@pytest.mark.parametrize("case", list(BAD_LAUNCH_ANSWERS))
def test_a_bad_launch_answer_leaves_the_outcome_unknown_and_never_resends(hostile, fast_launch, case):
    server = register(hostile)
    tool = f"bad-{uuid.uuid4().hex[:6]}"
    answer, expected = BAD_LAUNCH_ANSWERS[case]
    hostile.tool(tool, answer)
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments={}, user=None)
    assert async_to_sync(jobs.launch)(task.pk) == "outcome unknown"
    stored = Task.objects.get(pk=task.pk)
    assert stored.status == TaskStatus.LAUNCH_UNKNOWN
    assert expected in stored.status_message and len(stored.status_message) <= STATUS_MESSAGE_MAX_CHARS
    assert async_to_sync(jobs.launch)(task.pk) == "not launching"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_column_size(data) FROM audit_auditevent WHERE task_id = %s", [task.pk])
        assert max(size for (size,) in cursor.fetchall()) < 20_000
