"""The Tasks-extension client against the real demo server, over real HTTP and real stdio."""

from __future__ import annotations

import asyncio
import itertools
import ssl

import pytest
import pytest_asyncio

from taskhub.mcp.address_policy import AddressPolicy
from taskhub.mcp.client import (
    HttpTarget,
    TaskCreated,
    TasksClient,
    ToolCompleted,
    ToolInputRequired,
    http_client,
)
from taskhub.mcp.errors import AuthorizationFailed, TaskNotFound, TransportError
from taskhub.mcp.outbound import tls_context
from taskhub.mcp.wire import EXTENSION_ID, TaskSnapshot
from tests.demo_process import DemoServer, stdio_target
from tests.wire_recorder import WireRecorder

# One event loop for the module, so that one stdio session (one demo server process) serves its tests.
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

FAST = ("--poll-interval-ms", "100")


@pytest.fixture(scope="module")
def demo_server(shared_demo_server):
    return shared_demo_server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stdio_client():
    async with TasksClient(stdio_target(*FAST), timeout=15) as client:
        yield client


@pytest_asyncio.fixture(params=["http", "stdio"], loop_scope="module")
async def client(request, demo_server, stdio_client):
    if request.param == "stdio":
        yield stdio_client
        return
    async with TasksClient(demo_server.target, timeout=15) as client:
        yield client


async def created_task(client: TasksClient, tool: str, arguments: dict | None = None) -> TaskSnapshot:
    outcome = await client.call_tool(tool, arguments or {})
    assert isinstance(outcome, TaskCreated), outcome
    assert outcome.task.status in ("working", "input_required")
    return outcome.task


async def until(client: TasksClient, task: TaskSnapshot, predicate, timeout: float = 20) -> TaskSnapshot:
    """Follow `task` until `predicate(snapshot)` holds."""
    if predicate(task):
        return task
    async with asyncio.timeout(timeout):
        async for snapshot in client.follow(task):
            if predicate(snapshot):
                return snapshot
    raise AssertionError(f"task {task.task_id} ended without reaching the expected state")


def text_of(result: dict) -> str:
    return " ".join(block.get("text", "") for block in result.get("content", []) if block.get("type") == "text")


async def test_discover_reports_the_extension_and_the_tools(client):
    discovery = await client.discover()
    assert discovery.protocol_version == "2026-07-28"
    assert discovery.supports_tasks
    assert EXTENSION_ID in discovery.raw["capabilities"]["extensions"]
    names = {tool["name"] for tool in discovery.tools}
    assert {
        "quick",
        "progress",
        "approval",
        "two_questions",
        "url_consent",
        "fail",
        "tool_error",
        "long",
        "mrtr",
    } <= names


async def test_a_quick_tool_answers_synchronously(client):
    outcome = await client.call_tool("quick", {"text": "hi"})
    assert isinstance(outcome, ToolCompleted)
    assert not outcome.is_error
    assert text_of(outcome.result) == "echo: hi"


async def test_a_task_is_polled_to_completion_with_progress(client):
    task = await created_task(client, "progress", {"steps": 3, "step_ms": 150})
    messages = []
    final = task
    async for snapshot in client.follow(task):
        messages.append(snapshot.status_message)
        final = snapshot
    assert final.status == "completed"
    assert text_of(final.tool_result) == "finished 3 steps"
    assert any(message and "of 3" in message for message in messages)


async def test_an_approval_is_answered_and_the_task_completes(client):
    task = await created_task(client, "approval", {"action": "deploy"})
    waiting = await until(client, task, lambda s: s.status == "input_required")
    request = waiting.input_requests["approve"]
    assert request["method"] == "elicitation/create"
    assert "approved" in request["params"]["requestedSchema"]["properties"]
    answer = {"approve": {"action": "accept", "content": {"approved": True, "reason": "looks good"}}}
    await client.update_task(task.task_id, answer)
    final = await until(client, waiting, lambda s: s.is_terminal)
    assert final.status == "completed"
    assert text_of(final.tool_result) == "approved: deploy (reason: looks good)"


async def test_two_questions_answered_one_at_a_time(client):
    task = await created_task(client, "two_questions")
    waiting = await until(client, task, lambda s: s.status == "input_required")
    assert set(waiting.input_requests) == {"name", "color"}
    await client.update_task(task.task_id, {"name": {"action": "accept", "content": {"name": "Ada"}}})
    partial = await until(client, waiting, lambda s: set(s.input_requests or {}) == {"color"})
    assert partial.status == "input_required"
    await client.update_task(task.task_id, {"color": {"action": "accept", "content": {"color": "green"}}})
    final = await until(client, partial, lambda s: s.is_terminal)
    assert text_of(final.tool_result) == "name=Ada color=green"


async def test_a_url_mode_request_is_consented(client):
    task = await created_task(client, "url_consent")
    waiting = await until(client, task, lambda s: s.status == "input_required")
    params = waiting.input_requests["consent"]["params"]
    assert params["mode"] == "url"
    assert params["url"].startswith("https://")
    await client.update_task(task.task_id, {"consent": {"action": "accept"}})
    final = await until(client, waiting, lambda s: s.is_terminal)
    assert (final.status, text_of(final.tool_result)) == ("completed", "consented")


async def test_a_failing_task_ends_failed_with_its_error(client):
    final = await until(client, await created_task(client, "fail"), lambda s: s.is_terminal)
    assert final.status == "failed"
    assert final.error["code"] == -32603
    assert final.error["message"] == "Simulated failure"


async def test_a_tool_error_ends_completed_with_is_error(client):
    final = await until(client, await created_task(client, "tool_error"), lambda s: s.is_terminal)
    assert final.status == "completed"
    assert final.tool_result["isError"] is True


async def test_a_long_task_is_cancelled(client):
    task = await created_task(client, "long", {"seconds": 30})
    await client.cancel_task(task.task_id)
    final = await until(client, task, lambda s: s.is_terminal, timeout=10)
    assert final.status == "cancelled"


async def test_mrtr_input_comes_before_the_task(client):
    first = await client.call_tool("mrtr")
    assert isinstance(first, ToolInputRequired)
    assert "name" in first.input_requests
    responses = {"name": {"action": "accept", "content": {"name": "Grace"}}}
    retried = await client.call_tool("mrtr", input_responses=responses, request_state=first.request_state)
    assert isinstance(retried, TaskCreated)
    final = await until(client, retried.task, lambda s: s.is_terminal)
    assert text_of(final.tool_result) == "hello, Grace"


async def test_notifications_arrive_through_listen(client):
    task = await created_task(client, "progress", {"steps": 3, "step_ms": 200})
    seen = []
    async with asyncio.timeout(15), client.listen([task.task_id]) as subscription:
        assert subscription.accepted_task_ids == [task.task_id]
        async for snapshot in subscription:
            seen.append(snapshot)
            if snapshot.is_terminal:
                break
    assert seen[-1].status == "completed"
    assert all(snapshot.task_id == task.task_id for snapshot in seen)


async def test_an_unknown_task_id_is_a_typed_error(client):
    with pytest.raises(TaskNotFound):
        await client.get_task("no-such-task")


async def test_polls_honour_poll_interval_ms():
    with DemoServer("--poll-interval-ms", "300") as server:
        recorder = WireRecorder(server.url).start()
        try:
            async with TasksClient(HttpTarget(url=recorder.url)) as client:
                # Long enough for three polls even when the machine is slow to answer each.
                task = await created_task(client, "progress", {"steps": 10, "step_ms": 300})
                assert task.poll_interval_ms == 300
                final = await until(client, task, lambda s: s.is_terminal)
                assert final.status == "completed"
        finally:
            recorder.stop()
    polls = [e.at for e in recorder.requests("tasks/get") if e.body["params"]["taskId"] == task.task_id]
    assert len(polls) >= 3
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls)]
    assert min(gaps) >= 0.300 - 0.02, gaps


async def test_a_server_stopped_mid_poll_is_a_transport_error_and_a_restarted_one_resumes(tmp_path):
    state = str(tmp_path / "demo.sqlite")
    # Each tasks/get is held for a second, so the server dies while a poll is in flight.
    options = ("--state", state, "--poll-interval-ms", "100", "--get-delay-ms", "1000")
    server = DemoServer(*options).start()
    try:
        async with TasksClient(server.target, timeout=5) as client:
            task = await created_task(client, "progress", {"steps": 10, "step_ms": 300})
            poll = asyncio.ensure_future(client.get_task(task.task_id))
            await asyncio.sleep(0.3)
            server.kill()
            with pytest.raises(TransportError):
                await poll
            with pytest.raises(TransportError):
                await client.get_task(task.task_id)
            server.start()
            # The same client reconnects by itself.
            assert (await client.get_task(task.task_id)).task_id == task.task_id
        async with TasksClient(server.target, timeout=5) as fresh:
            final = await until(fresh, await fresh.get_task(task.task_id), lambda s: s.is_terminal)
            assert final.status == "completed"
    finally:
        server.stop()


async def test_http_clients_share_one_verifying_tls_context():
    # Building a verifying context loads the CA bundle (~60 ms of CPU, bench/approval.py): once per process, not
    # once per client (every delivery job opens one).
    first = http_client(HttpTarget(url="https://example.invalid/mcp"), timeout=5)
    second = http_client(HttpTarget(url="https://example.invalid/mcp", bearer_token="t"), timeout=45)
    async with first, second:
        assert first._transport._pool._ssl_context is tls_context()
        assert second._transport._pool._ssl_context is tls_context()
        assert tls_context().verify_mode == ssl.CERT_REQUIRED and tls_context().check_hostname
        assert second.headers["Authorization"] == "Bearer t" and "Authorization" not in first.headers
        assert (first.timeout.connect, first.timeout.read) == (5, 300)
        assert (second.timeout.connect, second.timeout.read) == (10, 300)
        assert not first.follow_redirects
    # Every stack connects out on that one context, with and without an address policy: httpx2 (the SDK's session,
    # webhooks), aiohttp and the raw pool (the tracker's polls).
    policed = HttpTarget(url="https://example.invalid/mcp", address_policy=AddressPolicy.build())
    async with http_client(policed, timeout=5) as third:
        assert third._transport._inner._pool._ssl_context is tls_context()
    for target in (policed, HttpTarget(url="https://example.invalid/mcp")):
        connector = target.outbound().aiohttp_connector(limit=1)
        assert connector._ssl is tls_context()
        await connector.close()


async def test_a_bearer_token_is_sent_and_a_refusal_says_so(shared_demo_server_requiring_token):
    server = shared_demo_server_requiring_token
    async with TasksClient(HttpTarget(url=server.url, bearer_token="s3cret"), timeout=5) as client:
        assert isinstance(await client.call_tool("quick", {"text": "a"}), ToolCompleted)
    async with TasksClient(HttpTarget(url=server.url, headers={"Authorization": "Bearer s3cret"})) as client:
        assert isinstance(await client.call_tool("quick", {"text": "b"}), ToolCompleted)
    async with TasksClient(HttpTarget(url=server.url, bearer_token="wrong"), timeout=5) as client:
        with pytest.raises(AuthorizationFailed, match="HTTP 401"):
            await client.call_tool("quick", {"text": "c"})
