"""A minimal HTTP/1.1 keep-alive client for the tracker's `tasks/get`: the plain case only, the rest left to aiohttp.

aiohttp's `ClientSession.post` costs ~0.1-0.15 ms of CPU per request (a request object, header multidicts, a
timer, a payload writer, a response object, a stream reader), as much as the whole rest of a poll. A server
that has answered plainly (HTTP/1.1, 200, `application/json`, a Content-Length, no content coding, keep-alive)
gets its requests written as pre-encoded bytes on kept connections, and its answers read by a small parser here.

Only that one shape is read here. Anything else (another status, an event stream, a chunked or compressed
body, a connection closed before the answer began, an address refused by the policy, a head over the cap) is
`Unusual`: the caller sends the request again through aiohttp, which says what it means exactly as before (a
`tasks/get` is a read: sending it twice changes nothing at the server), and stops using this path for that server
until aiohttp sees a plain answer again. A timeout, a body announced over the cap and an answer cut off mid-body
are not unusual: each is reported as aiohttp's path reports it, without a second try, since a server's next answer
may differ and this one is the one to report.

Timeouts cost no timer per request: one sweeper per pool, while requests are in flight, aborts those past
their deadline (at most a tenth of the timeout late).

Why it is kept beside aiohttp: measured with bench/tracker.py against bench/fake_tasks_server.py (bench/RESULTS.md,
"aiohttp's request machinery was half of a poll"), a `get_task` cost 225 us of the worker's CPU through aiohttp and
54 us through this pool; at saturation the worker went from 2.4x the bare aiohttp loop's CPU per poll to about half
of it. Its connections are opened by the same taskhub.mcp.outbound.Outbound as aiohttp's and httpx2's: to an address
the policy allows, checked at each new connection, on the same TLS context.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import aiohttp

from taskhub.mcp.outbound import Outbound

MAX_HEAD_BYTES = 16 * 1024
OVER_THE_CAP = "over the cap"
USER_AGENT = aiohttp.http.SERVER_SOFTWARE


class Unusual(Exception):
    """The answer (or the connection) is not the plain case: send the request through aiohttp instead."""


class TooLarge(Exception):
    """A plain answer that announces a body over the cap: the caller says so as aiohttp's path does (not sent again:
    a server's answers may differ from one request to the next, and this one is the one to report)."""


class BrokeOff(Exception):
    """The connection closed after the answer began: reported as an answer cut off, like aiohttp's path (not sent
    again, for the same reason)."""


class TimedOut(Exception):
    def __init__(self, answer_started: bool) -> None:
        super().__init__("timed out")
        self.answer_started = answer_started


def header_safe(text: str) -> bool:
    return text.isascii() and text.isprintable() and text == text.strip()


class RawEndpoint:
    """How to reach one URL with raw requests, or None (`RawEndpoint.of`) when only aiohttp may."""

    __slots__ = ("host", "port", "prefix", "ssl")

    def __init__(self, host: str, port: int, use_ssl: bool, prefix: bytes) -> None:
        self.host, self.port, self.ssl, self.prefix = host, port, use_ssl, prefix

    @classmethod
    def of(cls, url: str, headers: dict[str, str]) -> RawEndpoint | None:
        """The request line and the constant headers, encoded once; None for what aiohttp alone handles
        (credentials in the URL, an odd path, a header that is not plain printable ASCII)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
            return None
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if not header_safe(target) or " " in target or not header_safe(parts.netloc):
            return None
        default = (parts.scheme == "https" and port == 443) or (parts.scheme == "http" and port == 80)
        host_header = parts.netloc if not default or parts.port is None else parts.netloc.rsplit(":", 1)[0]
        lines = [f"POST {target} HTTP/1.1", f"Host: {host_header}"]
        for name, value in {**headers, "User-Agent": USER_AGENT}.items():
            if not header_safe(name) or ":" in name or not header_safe(value):
                return None
            lines.append(f"{name}: {value}")
        return cls(parts.hostname, port, parts.scheme == "https", ("\r\n".join(lines) + "\r\n").encode())


class _Connection(asyncio.Protocol):
    """One kept connection: at most one request at a time; its answer is read into a future."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.usable = True
        self.waiter: asyncio.Future | None = None
        self.deadline = 0.0
        self.buffer = bytearray()
        self.head_end = -1
        self.body_length = 0
        self.keep = True

    # asyncio.Protocol -------------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.usable = False
        # Closed before any byte of an answer: a kept connection the server let go, which a new one replaces.
        self._finish(
            BrokeOff(type(exc).__name__ if exc else "closed") if self.buffer else Unusual("the connection closed")
        )

    def eof_received(self) -> bool:
        self.usable = False
        return False

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # nothing asked: a server that talks out of turn loses the connection
            self.usable = False
            if self.transport is not None:
                self.transport.abort()
            return
        buffer = self.buffer
        buffer += data
        if self.head_end < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    self._fail(Unusual("the head of the answer is too large"))
                return
            if end > MAX_HEAD_BYTES:
                self._fail(Unusual("the head of the answer is too large"))
                return
            problem = self._read_head(bytes(buffer[:end]))
            if problem is not None:
                self._fail(TooLarge() if problem is OVER_THE_CAP else Unusual(problem))
                return
            self.head_end = end + 4
        received = len(buffer) - self.head_end
        if received < self.body_length:
            return
        if received > self.body_length:  # more than was announced: not a connection to keep
            self.keep = False
        self._finish(bytes(buffer[self.head_end : self.head_end + self.body_length]))

    # ------------------------------------------------------------------------------------------------------
    def _read_head(self, head: bytes) -> str | None:
        lines = head.split(b"\r\n")
        status_line = lines[0]
        if not status_line.startswith(b"HTTP/1.1 200 ") and status_line != b"HTTP/1.1 200":
            return "not a 200 answer"
        length = content_type = None
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                return "a malformed header"
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    return "an odd content-length"
                length = int(value)
            elif name == b"content-type":
                content_type = value.split(b";", 1)[0].strip().lower()
            elif name in (b"transfer-encoding", b"content-encoding"):
                return "a coded body"
            elif name == b"connection" and b"close" in value.lower():
                self.keep = False
        if content_type != b"application/json":
            return "not a JSON answer"
        if length is None:
            return "no length"
        if length > self.max_body:
            return OVER_THE_CAP
        self.body_length = length
        return None

    max_body = 0  # set by the pool

    def start(self, waiter: asyncio.Future, deadline: float, request: bytes) -> None:
        self.waiter, self.deadline = waiter, deadline
        self.buffer = bytearray()
        self.head_end = -1
        self.body_length = 0
        assert self.transport is not None
        self.transport.write(request)

    def time_out(self) -> None:
        self._fail(TimedOut(answer_started=bool(self.buffer)))

    def _fail(self, outcome: Exception) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.abort()
        self._finish(outcome)

    def _finish(self, outcome: bytes | Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)


class RawPool:
    """Kept connections to one endpoint; `post` returns the body of a plain answer or raises Unusual / TimedOut."""

    def __init__(
        self,
        endpoint: RawEndpoint,
        *,
        timeout: float,
        max_body: int,
        outbound: Outbound,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.max_body = max_body
        self._outbound = outbound
        self._idle: list[_Connection] = []
        self._in_flight: set[_Connection] = set()
        self._busy = 0
        self._sweeper: asyncio.Task | None = None
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Requests under way, those still connecting included."""
        return self._busy

    async def post(self, headers: bytes, body: bytes) -> bytes:
        """`headers`: the request's own header lines (each ending in CRLF), sent after the constant ones."""
        self._busy += 1
        try:
            return await self._post(headers, body)
        finally:
            self._busy -= 1

    async def _post(self, headers: bytes, body: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        connection = None
        while self._idle:
            candidate = self._idle.pop()
            if candidate.usable:
                connection = candidate
                break
            candidate.transport.abort()
        if connection is None:
            connection = await self._connect()
        request = b"".join(
            (self.endpoint.prefix, headers, b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n", body)
        )
        waiter = loop.create_future()
        connection.start(waiter, loop.time() + self.timeout, request)
        self._in_flight.add(connection)
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep(), name="raw http timeouts")
        try:
            outcome = await waiter
        except BaseException:  # cancelled: the answer would arrive for nobody
            connection.usable = False
            connection.transport.abort()
            raise
        finally:
            self._in_flight.discard(connection)
        if isinstance(outcome, Exception):
            raise outcome
        if connection.keep and connection.usable and not self._closed:
            self._idle.append(connection)
        else:
            connection.usable = False
            connection.transport.close()
        return outcome

    async def _connect(self) -> _Connection:
        endpoint = self.endpoint
        try:
            connection = await asyncio.wait_for(
                self._outbound.open_connection(_Connection, endpoint.host, endpoint.port, use_tls=endpoint.ssl),
                self.timeout,
            )
        except Exception as error:  # refused, unreachable, TLS, the address policy: aiohttp says which
            raise Unusual(f"no connection: {type(error).__name__}") from error
        connection.max_body = self.max_body
        return connection

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        every = min(max(self.timeout / 10, 0.01), 0.5)
        try:
            while self._in_flight:
                await asyncio.sleep(every)
                now = loop.time()
                for connection in [item for item in self._in_flight if item.deadline <= now]:
                    connection.time_out()
        finally:
            self._sweeper = None

    async def aclose(self) -> None:
        self._closed = True
        for connection in (*self._idle, *self._in_flight):
            if connection.transport is not None:
                connection.transport.abort()
        self._idle.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
