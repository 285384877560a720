"""A lean `tasks/get` for the tracker's hot path: one aiohttp session per server, no SDK session machinery.

Through the SDK one poll costs about 1.9 ms of CPU, through aiohttp about 0.2 ms (notes/mcp-sdk.md).
The request is the SDK's, byte for byte where it matters: the same JSON-RPC body and `_meta`
(`wire.request_meta`), the same routing headers (`wire.task_request_headers`) and the same
content-type and accept; `tests/test_lean_poll.py` compares the two on the wire. The answer may be a
JSON body or an SSE stream carrying the response, and is read with a size cap so that a hostile
server cannot exhaust memory. stdio servers have no HTTP to be lean on: :func:`task_getter` gives
them the SDK-based :class:`~taskhub.mcp.client.TasksClient`.

Leaner still, once aiohttp has seen a server answer plainly: the same bytes go on kept connections of the
getter's own (`taskhub.mcp.rawhttp`, a quarter of aiohttp's CPU per request), and anything but the plain case
goes again through aiohttp. An answer that repeats the last one about the same task (but for its JSON-RPC id)
is handed back as the same snapshot object, not validated again: the bulk of a tracker's polls.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from typing import Any, Protocol

import aiohttp
from opentelemetry import propagate, trace

from taskhub.mcp import wire
from taskhub.mcp.client import CLIENT_INFO, HttpTarget, ServerTarget, TasksClient
from taskhub.mcp.errors import (
    INTERNAL_ERROR,
    AuthorizationFailed,
    IncompleteAnswer,
    InvalidResult,
    RequestTimeout,
    TransportError,
    protocol_error,
)
from taskhub.mcp.excerpts import excerpt
from taskhub.mcp.rawhttp import BrokeOff, RawEndpoint, RawPool, TimedOut, TooLarge, Unusual
from taskhub.mcp.secret_urls import mask_urls_in
from taskhub.mcp.wire import TaskSnapshot

METHOD = "tasks/get"
DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_RESPONSE_BYTES = wire.MAX_RESPONSE_BYTES
# What the SDK's Streamable HTTP transport sends with every POST.
CONTENT_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
READ_CHUNK = 64 * 1024
# An answer byte for byte the last one about the same task (but for its JSON-RPC id) is the same snapshot: it is
# not parsed and validated again. Kept for small answers about working tasks only, for this many tasks per getter
# (the oldest dropped first).
SAME_ANSWER_MAX_BYTES = 2048
SAME_ANSWER_TASKS = 20_000


class TaskGetter(Protocol):
    async def get_task(self, task_id: str) -> TaskSnapshot: ...

    async def aclose(self) -> None: ...


def task_getter(
    target: ServerTarget, *, timeout: float = DEFAULT_TIMEOUT_SECONDS, concurrency: int = 100
) -> TaskGetter:
    """The lean path for HTTP servers; the SDK-based client for stdio servers and for HTTP servers whose requests
    are authorized through OAuth (the SDK's provider refreshes their tokens; the lean path sends headers only)."""
    if isinstance(target, HttpTarget) and target.auth is None:
        return LeanTaskGetter(target, timeout=timeout, concurrency=concurrency)
    return TasksClient(target, timeout=timeout)


class LeanTaskGetter:
    """`tasks/get` over one long-lived aiohttp session. Use it on one event loop; close it with `aclose`."""

    def __init__(
        self,
        target: HttpTarget,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        concurrency: int = 100,
        client_info: dict[str, Any] | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self._meta = wire.request_meta(client_info=client_info or CLIENT_INFO)
        # The body is json.dumps of {"jsonrpc", "id", "method", "params": {"taskId", "_meta"}}, byte for byte;
        # only the id and the task id change, so the rest is encoded once.
        meta = json.dumps(self._meta, separators=(",", ":"))
        self._body_head = '{"jsonrpc":"2.0","id":'
        self._body_middle = f',"method":"{METHOD}","params":{{"taskId":'
        self._body_tail = f',"_meta":{meta}}}}}'
        self._ids = itertools.count(1)
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None
        # The plain case on kept connections of our own (taskhub.mcp.rawhttp), once aiohttp has seen this server
        # answer plainly; None where only aiohttp may go (credentials in the URL, odd headers).
        self._raw_endpoint = RawEndpoint.of(target.url, {**target.all_headers(), **CONTENT_HEADERS})
        self._raw: RawPool | None = None
        self._raw_ok = False
        self._last_answers: dict[str, tuple[tuple[int, bytes], TaskSnapshot]] = {}

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            policy = self.target.address_policy  # checked on each connection: a name by the resolver, an IP here
            if policy is not None:
                policy.check_url(self.target.url)
            self._session = aiohttp.ClientSession(
                headers={**self.target.all_headers(), **CONTENT_HEADERS},
                connector=self.target.outbound().aiohttp_connector(limit=self._concurrency),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                # The SDK sends no cookies back either; each request stands alone (stateless HTTP).
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._raw is not None:
            await self._raw.aclose()
            self._raw = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_task(self, task_id: str) -> TaskSnapshot:
        request_id = next(self._ids)
        payload = (self._body_head + str(request_id) + self._body_middle + json.dumps(task_id) + self._tail()).encode()
        headers = wire.task_request_headers(method=METHOD, task_id=task_id)
        if self._raw_ok:
            raw = await self._post_raw(payload, headers)
            if raw is not None:
                return self._snapshot_of(raw, request_id, task_id)
        message = await self._post(payload, request_id, headers)
        return _result_of(message, request_id)

    def _snapshot_of(self, raw: bytes, request_id: int, task_id: str) -> TaskSnapshot:
        """The snapshot a plain answer carries; the very one of the last answer about the task when the bytes are
        the same but for the JSON-RPC id (a working task that did not move: most polls)."""
        key = _same_answer_key(raw, request_id) if len(raw) <= SAME_ANSWER_MAX_BYTES else None
        if key is not None:
            last = self._last_answers.get(task_id)
            if last is not None and last[0] == key:
                return last[1]
        message = _json_rpc_message(raw, 200)
        assert message is not None  # a 200 answer that is not JSON-RPC raised
        snapshot = _result_of(message, request_id)
        if (
            key is not None
            and snapshot.task_id == task_id
            and snapshot.status == "working"
            and snapshot.result is None
            and snapshot.error is None
            and not snapshot.input_requests
        ):
            answers = self._last_answers
            if task_id not in answers and len(answers) >= SAME_ANSWER_TASKS:
                del answers[next(iter(answers))]
            answers[task_id] = (key, snapshot)
        return snapshot

    async def _post_raw(self, payload: bytes, headers: dict[str, str]) -> bytes | None:
        """The plain case on a kept connection of our own; None: send it through aiohttp instead."""
        if self._raw is not None and self._raw.in_flight >= self._concurrency:
            return None  # past the limit, aiohttp's connector queues the request (the tracker never gets here)
        if self._raw is None:
            assert self._raw_endpoint is not None
            self._raw = RawPool(
                self._raw_endpoint,
                timeout=self.timeout,
                max_body=self.max_response_bytes,
                outbound=self.target.outbound(),
            )
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        try:
            raw = await self._raw.post(lines.encode(), payload)
        except Unusual:
            self._raw_ok = False  # until aiohttp sees a plain answer again
            return None
        except TooLarge:
            raise InvalidResult(f"{METHOD}: the answer is larger than {self.max_response_bytes} bytes") from None
        except BrokeOff as broke_off:
            where = self.target.describe()
            raise IncompleteAnswer(f"{METHOD}: {where}: the answer broke off mid-body ({broke_off})") from None
        except TimedOut as timed_out:
            self._raw_ok = False
            where = self.target.describe()
            if timed_out.answer_started:
                raise IncompleteAnswer(
                    f"{METHOD}: {where} began to answer but did not finish within {self.timeout:g}s"
                ) from None
            raise RequestTimeout(f"{METHOD}: no answer from {where} within {self.timeout:g}s") from None
        return raw

    def _tail(self) -> str:
        """The body's `_meta` and end; in a trace (a poll's span), with its W3C context as the SDK adds it (SEP-414)."""
        if not trace.get_current_span().get_span_context().is_valid:  # tracing off: the body encoded once
            return self._body_tail
        meta = dict(self._meta)
        propagate.inject(meta)
        return f',"_meta":{json.dumps(meta, separators=(",", ":"))}}}}}'

    async def _post(self, payload: bytes, request_id: int, headers: dict[str, str]) -> dict[str, Any]:
        where = self.target.describe()
        try:
            async with self._http().post(self.target.url, data=payload, headers=headers) as response:
                try:
                    return await self._read_message(response, request_id)
                except TimeoutError:
                    raise IncompleteAnswer(
                        f"{METHOD}: {where} began to answer but did not finish within {self.timeout:g}s"
                    ) from None
                except aiohttp.ClientPayloadError as error:
                    raise IncompleteAnswer(
                        f"{METHOD}: {where}: the answer broke off mid-body ({type(error).__name__})"
                    ) from error
        except TimeoutError:
            raise RequestTimeout(f"{METHOD}: no answer from {where} within {self.timeout:g}s") from None
        except aiohttp.ClientError as error:
            detail = mask_urls_in(f"{type(error).__name__}: {error}")
            raise TransportError(f"{METHOD}: {where}: {detail}".rstrip(": ")) from error

    async def _read_message(self, response: aiohttp.ClientResponse, request_id: int) -> dict[str, Any]:
        if response.status in (401, 403):
            raise _http_failure(response.status, self.target.describe())
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "text/event-stream":
            message = await self._read_sse_response(response, request_id)
        else:
            message = await self._read_json(response)
            if (
                message is not None
                and self._raw_endpoint is not None
                and response.status == 200
                and content_type == "application/json"
                and response.content_length is not None
                and response.version == aiohttp.HttpVersion11
                and "content-encoding" not in response.headers
                and "close" not in response.headers.get("connection", "").lower()
            ):
                self._raw_ok = True  # a plain answer: the next requests go on connections of our own
        if message is None:
            raise _http_failure(response.status, self.target.describe())
        return message

    async def _read_json(self, response: aiohttp.ClientResponse) -> dict[str, Any] | None:
        too_large = InvalidResult(f"{METHOD}: the answer is larger than {self.max_response_bytes} bytes")
        if response.content_length is not None:
            if response.content_length > self.max_response_bytes:
                raise too_large
            raw = await response.read()  # the whole body: aiohttp reads exactly content-length bytes
        else:
            # No length given (chunked): read to the end, but never more than the cap.
            # (StreamReader.read(n) would return whatever has arrived so far, not the whole body.)
            chunks, received = [], 0
            async for chunk in response.content.iter_chunked(READ_CHUNK):
                received += len(chunk)
                if received > self.max_response_bytes:
                    raise too_large
                chunks.append(chunk)
            raw = b"".join(chunks)
        return _json_rpc_message(raw, response.status)

    async def _read_sse_response(self, response: aiohttp.ClientResponse, request_id: int) -> dict[str, Any] | None:
        """Read events until the response to our request; notifications before it are skipped."""
        received = 0
        buffer = b""
        async for chunk in response.content.iter_chunked(READ_CHUNK):
            received += len(chunk)
            if received > self.max_response_bytes:
                raise InvalidResult(f"{METHOD}: the event stream is larger than {self.max_response_bytes} bytes")
            buffer += chunk
            events, buffer = _split_sse_events(buffer)
            for data in events:
                message = _json_or_none(data)
                if isinstance(message, dict) and "id" in message and "method" not in message:
                    if message["id"] != request_id:  # a response, to a request not sent on this stream
                        raise InvalidResult(f"{METHOD}: the answer's JSON-RPC id is not the request's")
                    return message
        if 200 <= response.status < 300:
            raise TransportError(f"{METHOD}: the event stream ended without a response")
        return None


def _same_answer_key(raw: bytes, request_id: int) -> tuple[int, bytes] | None:
    """Where the answer's `"id":<request id>` is and a digest of the rest; None unless that id is written exactly
    so, once (no other `"id":` anywhere), before the result. Two answers with the same key are the same bytes
    but for their ids, at the same place outside the result: the same result."""
    needle = b'"id":' + str(request_id).encode()
    at = raw.find(needle)
    end = at + len(needle)
    if at < 0 or raw[end : end + 1] not in (b",", b"}") or raw.count(b'"id":') != 1 or raw.find(b'"result"') < end:
        return None
    return at, hashlib.blake2b(raw[:at] + raw[end:], digest_size=16).digest()


def _json_rpc_message(raw: bytes, status: int) -> dict[str, Any] | None:
    try:
        message = json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        message = None
    if isinstance(message, dict) and "id" in message and ("result" in message or "error" in message):
        return message
    if 200 <= status < 300:
        raise InvalidResult(f"{METHOD}: the answer is not a JSON-RPC response")
    return None  # an HTTP error without a JSON-RPC body (a proxy's 502, a 401 page, …)


def _split_sse_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete events' `data:` payloads, and the unfinished rest of the buffer."""
    normalized = buffer.replace(b"\r\n", b"\n")
    *events, rest = normalized.split(b"\n\n")
    payloads = []
    for event in events:
        lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if lines:
            payloads.append(b"\n".join(lines))
    return payloads, rest


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _http_failure(status: int, where: str) -> Exception:
    if status in (401, 403):
        reason = "Unauthorized" if status == 401 else "Forbidden"
        return AuthorizationFailed(
            INTERNAL_ERROR,
            f"HTTP {status} {reason}: the server refused the credentials (check the token or headers)",
            {"httpStatus": status},
            method=METHOD,
        )
    if status >= 500 or status == 429:
        return TransportError(f"{METHOD}: {where} answered HTTP {status}")
    return protocol_error(INTERNAL_ERROR, f"HTTP {status} without a JSON-RPC answer", None, method=METHOD)


def _result_of(message: dict[str, Any], request_id: int) -> TaskSnapshot:
    if message.get("id") != request_id:
        # The ids themselves change with every poll: said, the same problem would be recorded anew each time.
        raise InvalidResult(f"{METHOD}: the answer's JSON-RPC id is not the request's")
    if "error" in message:
        error = message["error"]
        if not isinstance(error, dict) or not isinstance(error.get("code"), int):
            raise InvalidResult(f"{METHOD}: malformed JSON-RPC error {excerpt(repr(error))}")
        raise protocol_error(error["code"], str(error.get("message", "")), error.get("data"), method=METHOD)
    return wire.parse_get_task_result(message["result"])


async def close_all(getters: list[TaskGetter]) -> None:
    await asyncio.gather(*(getter.aclose() for getter in getters), return_exceptions=True)
