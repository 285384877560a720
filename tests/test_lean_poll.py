"""The tracker's lean `tasks/get` (aiohttp) sends what the SDK-based client sends, and reads answers safely."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from taskhub.mcp.client import HttpTarget, TaskCreated, TasksClient
from taskhub.mcp.errors import (
    AuthorizationFailed,
    IncompleteAnswer,
    InvalidResult,
    RequestTimeout,
    TaskNotFound,
    TransportError,
)
from taskhub.mcp.lean import LeanTaskGetter, task_getter
from tests.demo_process import stdio_target
from tests.helpers import free_port
from tests.wire_recorder import WireRecorder

HEADERS_THAT_MATTER = ("mcp-protocol-version", "mcp-method", "mcp-name", "content-type", "accept")


@pytest.fixture(scope="module")
def demo(shared_demo_server_requiring_token):
    return shared_demo_server_requiring_token


@pytest.fixture
def recorder(demo):
    recorder = WireRecorder(demo.url).start()
    yield recorder
    recorder.stop()


def authorized(url: str) -> HttpTarget:
    return HttpTarget(url=url, bearer_token="s3cret", headers={"X-Api-Key": "k-1"})


async def start_task(target: HttpTarget) -> str:
    async with TasksClient(target) as client:
        outcome = await client.call_tool("progress", {"steps": 3, "step_ms": 200})
    assert isinstance(outcome, TaskCreated)
    return outcome.task.task_id


async def test_lean_and_sdk_tasks_get_are_the_same_on_the_wire(recorder):
    target = authorized(recorder.url)
    task_id = await start_task(target)
    async with TasksClient(target) as client:
        by_sdk = await client.get_task(task_id)
    lean = LeanTaskGetter(target)
    try:
        by_lean = await lean.get_task(task_id)
    finally:
        await lean.aclose()

    sdk_request, lean_request = recorder.requests("tasks/get")
    assert {**lean_request.body, "id": None} == {**sdk_request.body, "id": None}
    for header in (*HEADERS_THAT_MATTER, "authorization", "x-api-key"):
        assert lean_request.headers.get(header) == sdk_request.headers.get(header), header
    assert lean_request.headers["mcp-name"] == task_id
    assert lean_request.path == sdk_request.path
    assert by_lean.task_id == by_sdk.task_id == task_id
    assert by_lean.status in ("working", "completed")


async def test_unknown_task_is_task_not_found(demo):
    lean = LeanTaskGetter(authorized(demo.url))
    try:
        with pytest.raises(TaskNotFound) as raised:
            await lean.get_task("no-such-task")
    finally:
        await lean.aclose()
    assert raised.value.code == -32602


async def test_refused_credentials_are_authorization_failed(demo):
    lean = LeanTaskGetter(HttpTarget(url=demo.url))
    try:
        with pytest.raises(AuthorizationFailed, match="HTTP 401"):
            await lean.get_task("any")
    finally:
        await lean.aclose()


async def test_nobody_listening_is_a_transport_error():
    lean = LeanTaskGetter(HttpTarget(url=f"http://127.0.0.1:{free_port()}/mcp"))
    try:
        with pytest.raises(TransportError):
            await lean.get_task("any")
    finally:
        await lean.aclose()


async def test_stdio_servers_fall_back_to_the_sdk_client():
    getter = task_getter(stdio_target())
    try:
        assert isinstance(getter, TasksClient)
        with pytest.raises(TaskNotFound):
            await getter.get_task("no-such-task")
    finally:
        await getter.aclose()


# --- answers a conforming but unusual, or a hostile, server may send ------------------------------------


TASK = {
    "resultType": "complete",
    "taskId": "t-1",
    "status": "working",
    "createdAt": "2026-07-28T10:00:00Z",
    "lastUpdatedAt": "2026-07-28T10:00:00Z",
    "ttlMs": None,
}


class OddServer:
    """A real HTTP server whose `tasks/get` answer is a function of the request id."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.port = free_port()
        app = Starlette(routes=[Route("/mcp", self._handle, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def target(self) -> HttpTarget:
        return HttpTarget(url=f"http://127.0.0.1:{self.port}/mcp")

    def __enter__(self) -> OddServer:
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.should_exit = True
        self._thread.join(5)

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        ANSWERING.set(request)
        return await self.answer(json.loads(body)["id"])


ANSWERING: contextvars.ContextVar[Request] = contextvars.ContextVar("answering")


async def once_the_client_has_gone() -> None:
    """Return once the client of the request being answered has closed its connection (it gave up waiting)."""
    request = ANSWERING.get()
    async with asyncio.timeout(30):
        while not await request.is_disconnected():
            await asyncio.sleep(0.02)


def sse(*messages: dict) -> bytes:
    return b"".join(b"event: message\r\ndata: " + json.dumps(m).encode() + b"\r\n\r\n" for m in messages)


async def poll(server: OddServer, **options) -> object:
    lean = LeanTaskGetter(server.target, **options)
    try:
        return await lean.get_task("t-1")
    finally:
        await lean.aclose()


async def test_an_sse_answer_is_read_past_notifications():
    async def answer(request_id):
        async def events():
            yield sse({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}})
            await asyncio.sleep(0.05)
            yield sse({"jsonrpc": "2.0", "id": request_id, "result": TASK})

        return StreamingResponse(events(), media_type="text/event-stream")

    with OddServer(answer) as server:
        snapshot = await poll(server)
    assert (snapshot.task_id, snapshot.status) == ("t-1", "working")


async def test_an_sse_stream_that_ends_without_the_response_is_a_transport_error():
    async def answer(request_id):
        return Response(sse({"jsonrpc": "2.0", "method": "notifications/message"}), media_type="text/event-stream")

    with OddServer(answer) as server, pytest.raises(TransportError, match="ended without a response"):
        await poll(server)


@pytest.mark.parametrize("media_type", ["application/json", "text/event-stream"])
async def test_an_answer_larger_than_the_cap_is_refused(media_type):
    padding = "x" * 50_000

    async def answer(request_id):
        message = {"jsonrpc": "2.0", "id": request_id, "result": {**TASK, "statusMessage": padding}}
        body = sse(message) if media_type == "text/event-stream" else json.dumps(message).encode()
        return Response(body, media_type=media_type)

    with OddServer(answer) as server:
        assert (await poll(server, max_response_bytes=100_000)).status_message == padding
        with pytest.raises(InvalidResult, match="larger than 10000 bytes"):
            await poll(server, max_response_bytes=10_000)


@pytest.mark.parametrize("length_given", [True, False])
async def test_an_answer_that_arrives_in_pieces_is_read_whole(length_given):
    """aiohttp's StreamReader.read(n) returns what has arrived so far; the body must be read to its end."""
    padding = "p" * 200_000

    async def answer(request_id):
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {**TASK, "statusMessage": padding}}).encode()

        async def pieces():
            for start in range(0, len(body), 50_000):
                yield body[start : start + 50_000]
                await asyncio.sleep(0.05)

        headers = {"content-length": str(len(body))} if length_given else {}
        return StreamingResponse(pieces(), media_type="application/json", headers=headers)

    with OddServer(answer) as server:
        assert (await poll(server)).status_message == padding


async def test_a_body_that_trickles_past_the_timeout_is_an_incomplete_answer():
    async def answer(request_id):
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": TASK}).encode()

        async def drip():
            for byte in body:
                yield bytes([byte])
                await asyncio.sleep(0.05)

        return StreamingResponse(drip(), media_type="application/json")

    with OddServer(answer) as server, pytest.raises(IncompleteAnswer, match="did not finish within"):
        await poll(server, timeout=0.5)


async def test_a_slow_server_times_out():
    async def answer(request_id):
        await once_the_client_has_gone()
        return Response(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": TASK}))

    with OddServer(answer) as server, pytest.raises(RequestTimeout):
        await poll(server, timeout=0.3)


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"result": {**TASK, "status": "sleeping"}}, "unknown task status"),
        ({"result": {**TASK, "resultType": "task"}}, "only for tools/call"),
        ({"error": "boom"}, "malformed JSON-RPC error"),
        ({"hello": "world"}, "not a JSON-RPC response"),
    ],
)
async def test_a_bad_answer_is_invalid_result(message, problem):
    async def answer(request_id):
        return Response(json.dumps({"jsonrpc": "2.0", "id": request_id, **message}), media_type="application/json")

    with OddServer(answer) as server, pytest.raises(InvalidResult, match=problem):
        await poll(server)


async def test_an_http_error_without_json_rpc_is_a_transport_error_when_the_server_side_failed():
    async def answer(request_id):
        return Response("bad gateway", status_code=502)

    with OddServer(answer) as server, pytest.raises(TransportError, match="HTTP 502"):
        await poll(server)


# --- after a plain answer: kept connections of the getter's own (taskhub.mcp.rawhttp) ---------------------


class RecordingServer(OddServer):
    """Answers plainly, and keeps each request's headers and body."""

    def __init__(self) -> None:
        super().__init__(None)
        self.requests: list[tuple[dict[str, str], dict]] = []

    async def _handle(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append((dict(request.headers), body))
        return plain(body["id"])


async def test_after_a_plain_answer_the_next_polls_go_on_kept_connections_the_same_on_the_wire():
    with RecordingServer() as server:
        target = HttpTarget(url=server.target.url, bearer_token="s3cret", headers={"X-Api-Key": "k-1"})
        lean = LeanTaskGetter(target)
        try:
            await lean.get_task("t-1")  # through aiohttp (the same as the SDK on the wire: the test above)
            by_raw = [await lean.get_task("t-1") for _ in range(3)]
            assert lean._raw is not None and lean._raw_ok, "the polls after a plain answer are sent raw"
            assert len(lean._raw._idle) == 1, "one kept connection for polls one after another"
        finally:
            await lean.aclose()

    (first_headers, first_body), *raw_requests = server.requests
    assert len(raw_requests) == 3
    for headers, body in raw_requests:
        assert {**body, "id": None} == {**first_body, "id": None}
        for header in (*HEADERS_THAT_MATTER, "authorization", "x-api-key", "host", "user-agent"):
            assert headers.get(header) == first_headers.get(header), header
    assert [body["id"] for _, body in server.requests] == [1, 2, 3, 4]
    assert all(snapshot.task_id == "t-1" for snapshot in by_raw)


def plain(request_id) -> Response:
    return Response(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": TASK}), media_type="application/json")


async def sse_answer(request_id):
    return Response(sse({"jsonrpc": "2.0", "id": request_id, "result": TASK}), media_type="text/event-stream")


async def bad_gateway(request_id):
    return Response("bad gateway", status_code=502)


async def not_json_rpc(request_id):
    return Response(json.dumps({"jsonrpc": "2.0", "id": request_id, "hello": 1}), media_type="application/json")


async def too_large(request_id):
    body = {"jsonrpc": "2.0", "id": request_id, "result": {**TASK, "statusMessage": "x" * 20_000}}
    return Response(json.dumps(body), media_type="application/json")


async def slow(request_id):
    await once_the_client_has_gone()
    return plain(request_id)


async def trickle(request_id):
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": TASK}).encode()

    async def drip():
        for byte in body:
            yield bytes([byte])
            await asyncio.sleep(0.05)

    return StreamingResponse(drip(), media_type="application/json", headers={"content-length": str(len(body))})


async def refused(request_id):
    return Response("no", status_code=401)


@pytest.mark.parametrize(
    ("odd", "outcome"),
    [
        (sse_answer, "working"),
        (bad_gateway, TransportError),
        (not_json_rpc, InvalidResult),
        (too_large, InvalidResult),
        (slow, RequestTimeout),
        (trickle, IncompleteAnswer),
        (refused, AuthorizationFailed),
    ],
)
async def test_a_server_that_answered_plainly_then_oddly_is_understood_as_on_a_first_poll(odd, outcome):
    async def answer(request_id):
        return plain(request_id) if request_id == 1 else await odd(request_id)

    with OddServer(answer) as server:
        lean = LeanTaskGetter(server.target, timeout=0.5, max_response_bytes=10_000)
        try:
            assert (await lean.get_task("t-1")).status == "working"
            assert lean._raw_ok
            if isinstance(outcome, str):
                assert (await lean.get_task("t-1")).status == outcome
            else:
                with pytest.raises(outcome):
                    await lean.get_task("t-1")
        finally:
            await lean.aclose()


async def test_a_kept_connection_the_server_closed_is_replaced():
    with OddServer(lambda request_id: asyncio.sleep(0, plain(request_id))) as server:
        lean = LeanTaskGetter(server.target)
        try:
            await lean.get_task("t-1")
            await lean.get_task("t-1")
            for connection in lean._raw._idle:
                connection.transport.close()  # as a server's idle timeout would
            await asyncio.sleep(0.05)
            assert (await lean.get_task("t-1")).task_id == "t-1"
            assert (await lean.get_task("t-1")).task_id == "t-1"
        finally:
            await lean.aclose()


async def test_the_same_answer_again_is_the_same_snapshot_and_any_other_is_read_anew():
    answers = iter(
        [
            {"result": TASK},  # through aiohttp
            {"result": TASK},  # raw, read
            {"result": TASK},  # raw, the same bytes but for the id: the same snapshot
            {"result": {**TASK, "statusMessage": "moved"}},
            {"result": {**TASK, "statusMessage": "moved"}},
            {"result": {**TASK, "statusMessage": "moved", "pollIntervalMs": 5}},
            {"result": {**TASK, "note": {"id": 7}}},  # another "id": never taken for the same answer
            {"result": {**TASK, "note": {"id": 7}}},
            {"result": {**TASK, "status": "sleeping"}},
            {"result": TASK},
        ]
    )

    async def answer(request_id):
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, **next(answers)}, separators=(",", ":"))
        return Response(body, media_type="application/json")

    with OddServer(answer) as server:
        lean = LeanTaskGetter(server.target)
        try:
            by_aiohttp, second, third = [await lean.get_task("t-1") for _ in range(3)]
            assert third is second and second.status_message is None and by_aiohttp is not second
            moved, moved_again, faster = [await lean.get_task("t-1") for _ in range(3)]
            assert moved is not second and moved.status_message == "moved"
            assert moved_again is moved
            assert faster is not moved and faster.poll_interval_ms == 5
            noted, noted_again = [await lean.get_task("t-1") for _ in range(2)]
            assert noted_again is not noted and noted_again == noted
            with pytest.raises(InvalidResult, match="unknown task status"):
                await lean.get_task("t-1")
            back = await lean.get_task("t-1")
            assert back.status_message is None and back.poll_interval_ms is None
        finally:
            await lean.aclose()


async def test_requests_past_the_concurrency_limit_wait_for_aiohttps_connections_instead():
    async def answer(request_id):
        await asyncio.sleep(0.2)
        return plain(request_id)

    with OddServer(answer) as server:
        lean = LeanTaskGetter(server.target, concurrency=2)
        try:
            await lean.get_task("t-1")
            snapshots = await asyncio.gather(*(lean.get_task("t-1") for _ in range(6)))
            assert all(snapshot.task_id == "t-1" for snapshot in snapshots)
            assert len(lean._raw._idle) == 2, "never more raw connections than the limit"
        finally:
            await lean.aclose()
