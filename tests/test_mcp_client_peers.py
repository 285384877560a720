"""The client against scripted peers: sloppy servers are tolerated, broken answers are typed errors."""

from __future__ import annotations

import threading

import pytest

from taskhub.mcp.client import HttpTarget, TaskCreated, TasksClient, ToolCompleted
from taskhub.mcp.errors import (
    InvalidResult,
    MethodNotFound,
    MissingCapability,
    ProtocolError,
    RequestTimeout,
    TaskNotFound,
    TransportError,
)
from tests.scripted_server import ScriptedServer

TASK = {
    "taskId": "t-1",
    "status": "working",
    "createdAt": "2026-11-29T10:00:00Z",
    "lastUpdatedAt": "2026-11-29T10:00:00Z",
}


@pytest.fixture
def scripted():
    servers = []

    def start(answers):
        server = ScriptedServer(answers).start()
        servers.append(server)
        return TasksClient(HttpTarget(url=server.url), timeout=3)

    yield start
    for server in servers:
        server.stop()


async def test_sloppy_but_harmless_answers_are_accepted(scripted):
    completed = {
        **TASK,
        "status": "completed",
        "ttlMs": None,
        "someVendorField": {"x": 1},
        # The inlined result repeats envelope keys: tolerated, and stripped from the tool result.
        "result": {"resultType": "complete", "_meta": {"a": 1}, "content": [{"type": "text", "text": "ok"}]},
    }
    async with scripted(
        {
            # No ttlMs at all, no pollIntervalMs, an extra field.
            "tools/call": {"resultType": "task", **TASK, "extra": True},
            "tasks/get": completed,
        }
    ) as client:
        outcome = await client.call_tool("work")
        assert isinstance(outcome, TaskCreated)
        assert outcome.task.poll_interval_ms is None
        assert outcome.task.ttl_ms is None
        final = await client.get_task("t-1")
        assert final.status == "completed"
        assert final.tool_result == {"content": [{"type": "text", "text": "ok"}]}


async def test_a_get_result_without_result_type_reads_as_complete(scripted):
    async with scripted({"tasks/get": {**TASK, "pollIntervalMs": 2500, "ttlMs": 60000}}) as client:
        snapshot = await client.get_task("t-1")
        assert (snapshot.status, snapshot.poll_interval_ms, snapshot.ttl_ms) == ("working", 2500, 60000)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"resultType": "task", **TASK}, "only for tools/call"),
        ({"resultType": "later", **TASK}, "unknown resultType"),
        ({**TASK, "status": "paused"}, "unknown task status"),
        ({**TASK, "status": "input_required"}, "without inputRequests"),
    ],
)
async def test_answers_that_break_the_protocol_are_invalid(scripted, answer, message):
    async with scripted({"tasks/get": answer}) as client:
        with pytest.raises(InvalidResult, match=message):
            await client.get_task("t-1")


async def test_an_unknown_result_type_to_tools_call_is_invalid(scripted):
    async with scripted({"tools/call": {"resultType": "deferred", "handle": "x"}}) as client:
        with pytest.raises(InvalidResult):
            await client.call_tool("work")


async def test_a_task_handle_to_an_ack_is_invalid(scripted):
    async with scripted({"tasks/cancel": {"resultType": "task", **TASK}}) as client:
        with pytest.raises(InvalidResult):
            await client.cancel_task("t-1")


async def test_errors_are_typed(scripted):
    required = {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
    answers = {
        "tasks/get": {"error": {"code": -32602, "message": "Failed to retrieve task: Task has expired"}},
        "tasks/update": {"error": {"code": -32021, "message": "Missing required client capability", "data": required}},
        "tools/call": {"error": {"code": -32603, "message": "boom"}},
    }
    async with scripted(answers) as client:
        with pytest.raises(TaskNotFound, match="expired"):
            await client.get_task("t-1")
        with pytest.raises(MissingCapability) as missing:
            await client.update_task("t-1", {"k": {"action": "cancel"}})
        assert missing.value.required_capabilities == required["requiredCapabilities"]
        with pytest.raises(MethodNotFound):
            await client.cancel_task("t-1")  # not scripted: the peer answers -32601
        with pytest.raises(ProtocolError) as internal:
            await client.call_tool("work")
        assert internal.value.code == -32603


async def test_a_slow_answer_is_a_timeout_and_the_client_keeps_working(scripted):
    timed_out = threading.Event()

    def slow(params):
        if params["taskId"] == "slow":
            timed_out.wait(10)  # answers only once the client has given up on it
        return TASK

    async with scripted({"tasks/get": slow}) as client:
        client.timeout = 0.5
        with pytest.raises(RequestTimeout):
            await client.get_task("slow")
        timed_out.set()
        client.timeout = 5
        assert (await client.get_task("t-1")).status == "working"


async def test_sync_result_is_a_completed_tool_call(scripted):
    answer = {"content": [{"type": "text", "text": "now"}], "isError": False}
    async with scripted({"tools/call": answer}) as client:
        outcome = await client.call_tool("work")
        assert isinstance(outcome, ToolCompleted)
        assert outcome.result["content"][0]["text"] == "now"


async def test_an_unreachable_server_is_a_transport_error():
    async with TasksClient(HttpTarget(url="http://127.0.0.1:9/mcp"), timeout=3) as client:
        with pytest.raises(TransportError, match=r"127\.0\.0\.1:9"):
            await client.get_task("t-1")


@pytest.fixture
def recorded():
    server = ScriptedServer(
        {"tasks/get": TASK, "tools/call": {"resultType": "task", **TASK}, "tasks/cancel": {"resultType": "complete"}}
    ).start()
    yield server
    server.stop()


async def test_meta_and_capabilities_on_every_request(recorded):
    async with TasksClient(HttpTarget(url=recorded.url), timeout=3) as client:
        await client.call_tool("work")
        await client.get_task("t-1")
        await client.cancel_task("t-1")
    methods = [message["method"] for message in recorded.received]
    assert {"tools/call", "tasks/get", "tasks/cancel"} <= set(methods)
    for message in recorded.received:
        meta = message["params"]["_meta"]
        assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
        capabilities = meta["io.modelcontextprotocol/clientCapabilities"]
        assert capabilities["extensions"] == {"io.modelcontextprotocol/tasks": {}}
        assert capabilities["elicitation"] == {"form": {}, "url": {}}
        assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "taskhub"
