"""A hostile MCP server for tests: real HTTP/1.1 on loopback, answers scripted per task id and per tool.

Raw asyncio (like bench/fake_tasks_server.py) rather than a framework, because the point is to answer
in ways a framework would not let a server answer: bytes that are not JSON, a body that trickles one
byte at a time, a connection reset halfway through the body. It answers `server/discover` and
`tools/list` like `scripted_server` does, refuses `subscriptions/listen` (-32601, so the tracker polls)
unless `listening` is set, acknowledges `tasks/update` and `tasks/cancel` (and records them), and for

- `tasks/get`: the script set for the task id with :meth:`HostileServer.script` (each poll takes the
  next answer, the last one repeats; an unknown id gets -32602);
- `tools/call`: the answer set for the tool name with :meth:`HostileServer.tool`.

An answer is a JSON-RPC result (:class:`Result`), a JSON-RPC error (:class:`Error`), raw bytes
(:class:`Raw`), a result sent slowly (:class:`Drip`), a result cut off by a reset (:class:`Reset`),
no answer at all (:class:`Silence`), or a function of the poll number giving one of those.

With `listening` set, `subscriptions/listen` answers with an event stream: the acknowledgement (every task id
asked for, or those `refuse_subscriptions` leaves), then whatever :meth:`HostileServer.notify` sends to every
open subscription, until the server stops: `notifications/tasks` params (the subscription id is added to
`_meta` unless they carry a `_meta`), a whole JSON-RPC message (:class:`Message`), or raw event bytes
(:class:`RawEvent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskhub.demo.server import tcp_socket
from tests.scripted_server import DISCOVER_RESULT, TOOLS_RESULT


@dataclass(frozen=True)
class Result:
    value: Any


@dataclass(frozen=True)
class Error:
    error: Any


@dataclass(frozen=True)
class Raw:
    """Exactly these bytes as the body (with this content type and HTTP status); `body` may be a function of the
    request's JSON-RPC id giving them."""

    body: bytes | Callable[[Any], bytes]
    content_type: str = "application/json"
    status: int = 200


@dataclass(frozen=True)
class Drip:
    """A complete, valid answer, sent `bytes_per_tick` bytes every `tick` seconds."""

    value: Any
    tick: float = 0.2
    bytes_per_tick: int = 1


@dataclass(frozen=True)
class Reset:
    """Headers promising the whole answer, then `fraction` of its body, then a TCP reset."""

    value: Any
    fraction: float = 0.5


@dataclass(frozen=True)
class Silence:
    """No answer, ever: the request is read and the connection stays open until the client gives up."""


Answer = Result | Error | Raw | Drip | Reset | Silence | Callable[[int], "Answer"]


@dataclass(frozen=True)
class Message:
    """A whole JSON-RPC message (any JSON value, in fact) as one event's data."""

    value: Any


@dataclass(frozen=True)
class RawEvent:
    """Exactly these bytes on the event stream (the blank line that ends an event included, or not)."""

    data: bytes


Notification = dict[str, Any] | Message | RawEvent

UNKNOWN_TASK = Error({"code": -32602, "message": "Task not found"})
ACK = {"resultType": "complete"}


def working(task_id: str, **fields: Any) -> dict[str, Any]:
    """A valid `tasks/get` result for a working task (fields override or add)."""
    return {"resultType": "complete", "taskId": task_id, "status": "working", "pollIntervalMs": 250, **fields}


class HostileServer:
    def __init__(self, *, listening: bool = False) -> None:
        self.listening = listening
        self.subscribed: list[list[str]] = []
        self._streams: list[tuple[Any, asyncio.Queue[Notification | None]]] = []
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Answer]] = {}
        self._tools: dict[str, Answer] = {}
        self.polls: Counter[str] = Counter()
        self.updates: list[tuple[str, dict[str, Any]]] = []
        self.cancels: list[str] = []
        self.tool_calls: list[str] = []
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    # -- scripting (from the test's thread) -------------------------------------------------------

    def script(self, task_id: str, *answers: Answer) -> None:
        with self._lock:
            self._scripts[task_id] = list(answers)

    def tool(self, name: str, answer: Answer) -> None:
        with self._lock:
            self._tools[name] = answer

    def notify(self, *notifications: Notification) -> int:
        """Send these to every open subscription; returns how many subscriptions there were."""
        assert self._loop is not None
        done = threading.Event()
        count = 0

        def send() -> None:
            nonlocal count
            count = len(self._streams)
            for _, queue in self._streams:
                for notification in notifications:
                    queue.put_nowait(notification)
            done.set()

        self._loop.call_soon_threadsafe(send)
        done.wait(5)
        return count

    def subscribed_to(self, task_id: str) -> bool:
        with self._lock:
            return any(task_id in ids for ids in self.subscribed)

    def forget(self, task_id: str) -> None:
        with self._lock:
            self._scripts.pop(task_id, None)

    def _next_answer(self, task_id: str) -> Answer:
        with self._lock:
            self.polls[task_id] += 1
            answers = self._scripts.get(task_id)
            if not answers:
                return UNKNOWN_TASK
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            count = self.polls[task_id]
        while callable(answer):
            answer = answer(count)
        return answer

    # -- serving ----------------------------------------------------------------------------------

    def start(self) -> HostileServer:
        listening = tcp_socket()
        listening.bind(("127.0.0.1", 0))
        self.port = listening.getsockname()[1]
        ready = threading.Event()

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            server = self._loop.run_until_complete(asyncio.start_server(self._serve, sock=listening))
            ready.set()
            try:
                self._loop.run_forever()
            finally:
                server.close()
                for writer in list(self._connections):
                    writer.transport.abort()
                pending = asyncio.all_tasks(self._loop)
                for task in pending:
                    task.cancel()
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self._loop.close()

        self._thread = threading.Thread(target=main, name=f"hostile-server-{self.port}", daemon=True)
        self._thread.start()
        ready.wait(5)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in header_lines if line)
                }
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                if not request_line.startswith("POST "):
                    await _send(writer, 405, b"", "text/plain")
                    continue
                if not await self._answer(writer, json.loads(body)):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # stopped with a subscription's stream open: asyncio would log the cancellation as an error
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, message: dict[str, Any]) -> bool:
        """Send the answer to one request; False when the connection is done for (reset or abandoned)."""
        if "id" not in message:
            await _send(writer, 202, b"", "application/json")
            return True
        request_id, method = message["id"], message.get("method")
        params = message.get("params") or {}
        answer: Answer
        if method == "server/discover":
            answer = Result(DISCOVER_RESULT)
        elif method == "tools/list":
            answer = Result(TOOLS_RESULT)
        elif method == "tasks/get":
            answer = self._next_answer(str(params.get("taskId")))
        elif method == "tasks/update":
            with self._lock:
                self.updates.append((params.get("taskId"), params.get("inputResponses")))
            answer = Result(ACK)
        elif method == "tasks/cancel":
            with self._lock:
                self.cancels.append(params.get("taskId"))
            answer = Result(ACK)
        elif method == "subscriptions/listen" and self.listening:
            return await self._stream(writer, request_id, params)
        elif method == "tools/call":
            with self._lock:
                self.tool_calls.append(params.get("name"))
                answer = self._tools.get(params.get("name"), Error({"code": -32602, "message": "Unknown tool"}))
            while callable(answer):
                answer = answer(0)
        else:
            answer = Error({"code": -32601, "message": "Method not found"})
        return await self._send_answer(writer, request_id, answer)

    async def _stream(self, writer: asyncio.StreamWriter, request_id: Any, params: dict[str, Any]) -> bool:
        task_ids = [t for t in (params.get("notifications") or {}).get("taskIds") or [] if isinstance(t, str)]
        meta = {"io.modelcontextprotocol/subscriptionId": request_id}
        queue: asyncio.Queue[Notification | None] = asyncio.Queue()
        writer.write(
            b"HTTP/1.1 200 X\r\ncontent-type: text/event-stream\r\ncache-control: no-store\r\nconnection: close\r\n\r\n"
        )
        writer.write(
            _event(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/subscriptions/acknowledged",
                    "params": {"_meta": meta, "notifications": {"taskIds": task_ids}},
                }
            )
        )
        entry = (writer, queue)
        with self._lock:
            self.subscribed.append(task_ids)
        self._streams.append(entry)
        try:
            await writer.drain()
            while (notification := await queue.get()) is not None:
                if isinstance(notification, RawEvent):
                    writer.write(notification.data)
                elif isinstance(notification, Message):
                    writer.write(_event(notification.value))
                else:
                    params = notification if "_meta" in notification else {**notification, "_meta": meta}
                    writer.write(_event({"jsonrpc": "2.0", "method": "notifications/tasks", "params": params}))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            self._streams.remove(entry)
            with self._lock:
                self.subscribed.remove(task_ids)
        return False

    async def _send_answer(self, writer: asyncio.StreamWriter, request_id: Any, answer: Answer) -> bool:
        if isinstance(answer, Raw):
            body = answer.body(request_id) if callable(answer.body) else answer.body
            return await _send(writer, answer.status, body, answer.content_type)
        if isinstance(answer, Error):
            return await _send(writer, 200, _encode({"jsonrpc": "2.0", "id": request_id, "error": answer.error}))
        if isinstance(answer, Silence):
            await writer.wait_closed()
            return False
        body = _encode({"jsonrpc": "2.0", "id": request_id, "result": answer.value})
        if isinstance(answer, Result):
            return await _send(writer, 200, body)
        writer.write(_head(200, len(body), "application/json"))
        if isinstance(answer, Reset):
            writer.write(body[: int(len(body) * answer.fraction)])
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            _reset(writer)
            return False
        assert isinstance(answer, Drip)
        try:
            for start in range(0, len(body), answer.bytes_per_tick):
                writer.write(body[start : start + answer.bytes_per_tick])
                await writer.drain()
                await asyncio.sleep(answer.tick)
                if writer.is_closing() or writer.transport.get_extra_info("socket") is None:
                    return False
        except ConnectionError:
            return False
        return True


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def _event(value: Any) -> bytes:
    return b"event: message\ndata: " + json.dumps(value).encode() + b"\n\n"


def _head(status: int, length: int, content_type: str) -> bytes:
    return f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\n\r\n".encode("latin-1")


async def _send(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str = "application/json") -> bool:
    writer.write(_head(status, len(body), content_type) + body)
    try:
        await writer.drain()
    except ConnectionError:
        return False
    return True


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) rather than an orderly FIN."""
    sock = writer.transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
