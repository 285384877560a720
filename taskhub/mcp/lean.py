"""A lean `tasks/get` for the tracker's hot path: one aiohttp session per server, no SDK session machinery.

Through the SDK one poll costs about 1.9 ms of CPU, through aiohttp about 0.2 ms (notes/mcp-sdk.md).
The request is the SDK's, byte for byte where it matters: the same JSON-RPC body and `_meta`
(`wire.request_meta`), the same routing headers (`wire.task_request_headers`) and the same
content-type and accept; `tests/test_lean_poll.py` compares the two on the wire. The answer may be a
JSON body or an SSE stream carrying the response, and is read with a size cap so that a hostile
server cannot exhaust memory. stdio servers have no HTTP to be lean on: :func:`task_getter` gives
them the SDK-based :class:`~taskhub.mcp.client.TasksClient`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, Protocol

import aiohttp

from taskhub.mcp import wire
from taskhub.mcp.address_policy import PolicyResolver
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
from taskhub.mcp.secret_urls import mask_urls_in
from taskhub.mcp.wire import TaskSnapshot

METHOD = "tasks/get"
DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_RESPONSE_BYTES = wire.MAX_RESPONSE_BYTES
# What the SDK's Streamable HTTP transport sends with every POST.
CONTENT_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
READ_CHUNK = 64 * 1024


class TaskGetter(Protocol):
    async def get_task(self, task_id: str) -> TaskSnapshot: ...

    async def aclose(self) -> None: ...


def task_getter(
    target: ServerTarget, *, timeout: float = DEFAULT_TIMEOUT_SECONDS, concurrency: int = 100
) -> TaskGetter:
    """The lean path for HTTP servers; the SDK-based client for stdio servers."""
    if isinstance(target, HttpTarget):
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

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            policy = self.target.address_policy  # checked on each connection: a name by the resolver, an IP here
            if policy is not None:
                policy.check_url(self.target.url)
            self._session = aiohttp.ClientSession(
                headers={**self.target.all_headers(), **CONTENT_HEADERS},
                connector=aiohttp.TCPConnector(
                    limit=self._concurrency, resolver=PolicyResolver(policy) if policy is not None else None
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                # The SDK sends no cookies back either; each request stands alone (stateless HTTP).
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_task(self, task_id: str) -> TaskSnapshot:
        request_id = next(self._ids)
        payload = self._body_head + str(request_id) + self._body_middle + json.dumps(task_id) + self._body_tail
        headers = wire.task_request_headers(method=METHOD, task_id=task_id)
        message = await self._post(payload.encode(), request_id, headers)
        return _result_of(message, request_id)

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
        try:
            message = json.loads(raw) if raw else None
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            message = None
        if isinstance(message, dict) and "id" in message and ("result" in message or "error" in message):
            return message
        if 200 <= response.status < 300:
            raise InvalidResult(f"{METHOD}: the answer is not a JSON-RPC response")
        return None  # an HTTP error without a JSON-RPC body (a proxy's 502, a 401 page, …)

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
