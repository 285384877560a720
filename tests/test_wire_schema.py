"""What goes over the wire, checked against the extension's JSON Schema (tests/spec/schema.json).

The client drives the demo server through a recording proxy over real HTTP; every request the client
sent and every result the server returned is validated against the schema's definitions, and the
routing headers against the spec's rules.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import pytest

from taskhub.mcp.client import HttpTarget, TaskCreated, TasksClient, ToolInputRequired
from tests.wire_recorder import WireRecorder

pytestmark = pytest.mark.slow

SCHEMA = json.loads((Path(__file__).parent / "spec" / "schema.json").read_text())
META_KEYS = {
    "io.modelcontextprotocol/protocolVersion",
    "io.modelcontextprotocol/clientInfo",
    "io.modelcontextprotocol/clientCapabilities",
}


def validate(instance, definition: str) -> None:
    schema = {**SCHEMA, "$ref": f"#/$defs/{definition}"}
    jsonschema.Draft202012Validator(schema).validate(instance)


@pytest.fixture(scope="module")
def recorded_wire(shared_demo_server):
    """One run of the whole lifecycle, recorded."""
    recorder = WireRecorder(shared_demo_server.url).start()
    try:
        asyncio.run(drive_lifecycle(recorder.url))
    finally:
        recorder.stop()
    return recorder


async def drive_lifecycle(url: str) -> None:
    async with TasksClient(HttpTarget(url=url), timeout=15) as client:
        await client.discover()
        await client.call_tool("quick", {"text": "x"})
        for tool in ("progress", "fail", "tool_error"):
            outcome = await client.call_tool(tool, {"steps": 2, "step_ms": 100} if tool == "progress" else {})
            async for _ in client.follow(outcome.task):
                pass
        approval = await client.call_tool("approval", {"action": "ship"})
        async for snapshot in client.follow(approval.task):
            if snapshot.status == "input_required":
                answer = {"action": "accept", "content": {"approved": True, "reason": "fine"}}
                await client.update_task(snapshot.task_id, {"approve": answer})
        long = await client.call_tool("long", {"seconds": 20})
        await client.cancel_task(long.task.task_id)
        async for _ in client.follow(long.task):
            pass
        first = await client.call_tool("mrtr")
        assert isinstance(first, ToolInputRequired)
        answered = {"name": {"action": "accept", "content": {"name": "Lin"}}}
        task = await client.call_tool("mrtr", input_responses=answered, request_state=first.request_state)
        assert isinstance(task, TaskCreated)
        listened = await client.call_tool("progress", {"steps": 2, "step_ms": 150})
        async with asyncio.timeout(10), client.listen([listened.task.task_id]) as subscription:
            async for snapshot in subscription:
                if snapshot.is_terminal:
                    break


def results_of(exchanges):
    return [m["result"] for e in exchanges for m in e.messages if isinstance(m, dict) and "result" in m]


def test_every_request_carries_meta_and_declares_the_extension(recorded_wire):
    requests = recorded_wire.requests()
    assert {"server/discover", "tools/list", "tools/call", "tasks/get", "tasks/update", "tasks/cancel"} <= {
        e.body["method"] for e in requests
    }
    for exchange in requests:
        validate(exchange.body, "JSONRPCRequest")
        meta = exchange.body["params"]["_meta"]
        assert set(meta) >= META_KEYS, exchange.body["method"]
        capabilities = meta["io.modelcontextprotocol/clientCapabilities"]
        assert capabilities["extensions"]["io.modelcontextprotocol/tasks"] == {}
        assert capabilities["elicitation"] == {"form": {}, "url": {}}
        assert exchange.headers["mcp-protocol-version"] == "2026-07-28"
        assert exchange.headers["mcp-method"] == exchange.body["method"]


@pytest.mark.parametrize(
    ("method", "request_definition", "result_definition"),
    [
        ("tasks/get", "GetTaskRequest", "GetTaskResult"),
        ("tasks/update", "UpdateTaskRequest", "UpdateTaskResult"),
        ("tasks/cancel", "CancelTaskRequest", "CancelTaskResult"),
    ],
)
def test_task_methods_match_the_schema(recorded_wire, method, request_definition, result_definition):
    exchanges = recorded_wire.requests(method)
    assert exchanges
    for exchange in exchanges:
        validate(exchange.body, request_definition)
        assert exchange.headers["mcp-name"] == exchange.body["params"]["taskId"]
    results = results_of(exchanges)
    assert results
    for result in results:
        validate(result, result_definition)
    if method == "tasks/get":
        assert {r["status"] for r in results} >= {"working", "input_required", "completed", "failed", "cancelled"}
        for result in results:
            validate({k: v for k, v in result.items() if k != "resultType"}, "DetailedTask")


def test_tool_calls_match_the_schema(recorded_wire):
    exchanges = recorded_wire.requests("tools/call")
    kinds = set()
    for exchange in exchanges:
        params = exchange.body["params"]
        assert exchange.headers["mcp-name"] == params["name"]
        if "inputResponses" in params:
            validate(params["inputResponses"], "InputResponses")
        for result in results_of([exchange]):
            kinds.add(result.get("resultType"))
            if result.get("resultType") == "task":
                validate(result, "CreateTaskResult")
                assert not {"result", "error", "inputRequests", "requestState"} & set(result)
            elif result.get("resultType") == "input_required":
                validate(result["inputRequests"], "InputRequests")
                assert isinstance(result.get("requestState"), str)
            else:
                assert result["resultType"] == "complete"
                assert isinstance(result["content"], list)
    assert kinds == {"task", "input_required", "complete"}


def test_notifications_match_the_schema(recorded_wire):
    (listen,) = recorded_wire.requests("subscriptions/listen")
    assert listen.body["params"]["notifications"]["taskIds"]
    messages = [m for m in listen.messages if isinstance(m, dict)]
    assert messages[0]["method"] == "notifications/subscriptions/acknowledged"
    assert messages[0]["params"]["notifications"]["taskIds"] == listen.body["params"]["notifications"]["taskIds"]
    notifications = [m for m in messages if m.get("method") == "notifications/tasks"]
    assert notifications
    for notification in notifications:
        validate(notification, "TaskStatusNotification")
        assert notification["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == listen.body["id"]
