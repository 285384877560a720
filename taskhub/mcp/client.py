"""An asyncio client for MCP servers that speak the Tasks extension (protocol revision 2026-07-28).

Built on the `mcp` SDK: the SDK negotiates the version (`server/discover`, falling back to
`initialize`), stamps `_meta` and the routing headers on every request, and owns the transports.
This module adds the extension on the SDK's hooks (see :mod:`taskhub.mcp.extension`) and two things
the SDK lacks: typed errors, and a connection that survives transport failures — the SDK's client
dies with its transport, so each :class:`TasksClient` holds one SDK client at a time in a supervisor
task of its own and builds a fresh one on the next call after a failure.

A `TasksClient` must be used on one event loop (the SDK's rule); it is cheap to keep open.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import httpx2
import mcp_types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter, ValidationError

from taskhub.mcp import sdk_private, session_tasks, wire
from taskhub.mcp.address_policy import AddressPolicy
from taskhub.mcp.errors import (
    AuthorizationFailed,
    AuthorizationIncomplete,
    AuthorizationProblem,
    InvalidResult,
    InvalidToolDefinition,
    McpClientError,
    ProtocolError,
    RequestTimeout,
    TransportError,
    protocol_error,
)
from taskhub.mcp.excerpts import describe_exception, excerpt, validation_summary
from taskhub.mcp.extension import (
    CancelTaskRequest,
    GetTaskRequest,
    TaskIdParams,
    TasksClientExtension,
    UpdateTaskParams,
    UpdateTaskRequest,
)
from taskhub.mcp.outbound import Outbound
from taskhub.mcp.questions import SAMPLING_REFUSED, Asker, LogSink, PausableDeadline, Questions
from taskhub.mcp.secret_urls import mask_url, mask_urls_in, mask_urls_in_logs_of
from taskhub.mcp.stdio import BadLine, ProcessObserver, stdio_transport
from taskhub.mcp.tool_headers import header_problem, param_headers
from taskhub.mcp.wire import CreateTaskResult, TaskSnapshot

logger = logging.getLogger(__name__)
# The SDK logs its endpoint and httpx2 every request's URL: with the query's secrets, but for this filter.
mask_urls_in_logs_of("mcp.client.streamable_http", "httpx2")

_RAW = TypeAdapter(dict[str, Any])
_listen_ids = itertools.count(1)


def _client_version() -> str:
    try:
        return version("taskhub")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


CLIENT_INFO: dict[str, Any] = {"name": "taskhub", "version": _client_version()}


IDLE_CONNECTION_SECONDS = 1.0


def http_client(target: HttpTarget, *, timeout: float) -> httpx2.AsyncClient:
    """The SDK's `create_mcp_http_client` (timeouts and headers, no redirects followed), on the shared TLS context."""
    # An idle connection is dropped long before servers close theirs (uvicorn and Node: 5 s). A request sent just
    # as the server closes an idle connection fails with no way to know whether it was read: for tools/call
    # (sent after the launch marker is written, which can take seconds under load) the outcome becomes unknown.
    limits = httpx2.Limits(keepalive_expiry=IDLE_CONNECTION_SECONDS)
    return target.outbound().httpx_client(
        headers=target.all_headers(),
        timeout=httpx2.Timeout(min(timeout, 10.0), read=max(timeout, 300.0)),
        limits=limits,
        auth=target.auth,
    )


# --- targets --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OwnAnswers:
    """What taskhub answers a server's own requests with, by itself (the 2025 revisions): `roots/list` from `roots`
    ((uri, name) pairs; none by default), and `sampling/createMessage` offered to people (`sampling`) or refused
    outright (then not declared at `initialize` either)."""

    roots: tuple[tuple[str, str], ...] = ()
    sampling: bool = True

    def roots_result(self) -> mcp_types.ListRootsResult:
        return mcp_types.ListRootsResult(
            roots=[mcp_types.Root(uri=uri, name=name or None) for uri, name in self.roots]  # type: ignore[arg-type]
        )


@dataclass(frozen=True, kw_only=True)
class HttpTarget:
    """A Streamable HTTP endpoint, with optional bearer token and extra headers (e.g. an API key).

    Credentials are left out of repr() and describe() (the URL's masked): a target in a log line or a traceback
    must not carry them.
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    # Where the server may be reached (checked on every connection); None: anywhere.
    address_policy: AddressPolicy | None = field(default=None, repr=False, compare=False)
    own_answers: OwnAnswers = field(default_factory=OwnAnswers, repr=False)
    # Authorizes requests when the server demands it (taskhub.mcp.oauth.oauth_provider: OAuth, its requests to the
    # authorization server made through this target's outbound client); it keeps its tokens across reconnects.
    auth: httpx2.Auth | None = field(default=None, repr=False, compare=False)

    def outbound(self) -> Outbound:
        return Outbound(self.address_policy)

    def all_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        return headers

    def describe(self) -> str:
        return mask_url(self.url)

    def __repr__(self) -> str:
        return f"HttpTarget(url={self.describe()!r})"


@dataclass(frozen=True, kw_only=True)
class StdioTarget:
    """A server launched as a subprocess speaking JSON-RPC on stdin/stdout (its environment left out of repr())."""

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    own_answers: OwnAnswers = field(default_factory=OwnAnswers, repr=False)

    def same_process(self, other: StdioTarget) -> bool:
        """Whether `other` starts the same process (only what taskhub answers by itself differs)."""
        return dataclasses.replace(other, own_answers=self.own_answers) == self

    def describe(self) -> str:
        return " ".join([self.command, *self.args])


ServerTarget = HttpTarget | StdioTarget


# --- outcomes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Discovery:
    """What a server says about itself: its protocol version, capabilities and tools."""

    protocol_version: str
    server_info: dict[str, Any] | None
    capabilities: dict[str, Any]
    tools: list[dict[str, Any]]
    """As listed, tools with invalid `x-mcp-header` annotations included (`tool_headers.header_problem` says
    which: the client refuses to call them)."""
    raw: dict[str, Any]
    """The `server/discover` result (or, for an older server, the `initialize` result) as sent."""

    @property
    def supports_tasks(self) -> bool:
        return wire.EXTENSION_ID in (self.capabilities.get("extensions") or {})


@dataclass(frozen=True)
class ToolCompleted:
    """`tools/call` answered synchronously with a `CallToolResult`."""

    result: dict[str, Any]

    @property
    def is_error(self) -> bool:
        return bool(self.result.get("isError"))


@dataclass(frozen=True)
class ToolInputRequired:
    """`tools/call` needs input first (MRTR): retry with `inputResponses` and this `requestState`."""

    input_requests: dict[str, dict[str, Any]]
    request_state: str | None


@dataclass(frozen=True)
class TaskCreated:
    """`tools/call` answered with a durable task handle."""

    task: TaskSnapshot
    # A 2025-11-25 task (taskhub.mcp.session_tasks): it lives on the session that created it, which must stay open
    # to follow it (`get_session_task`, `session_task_result`, `cancel_session_task`).
    on_session: bool = False
    # The progress token of the call that made a 2025-11-25 task: the server keeps using it for the task's progress
    # after the call answered (`session_task_progress`). None when the call asked for no progress.
    progress_token: str | None = None


CallOutcome = ToolCompleted | ToolInputRequired | TaskCreated


# --- the connection -------------------------------------------------------------------------------


class _Connection:
    """One SDK `Client`, entered and exited in its own supervisor task as the SDK requires."""

    def __init__(self, owner: TasksClient) -> None:
        self._owner = owner
        self._closing = asyncio.Event()
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self.dead: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(), name=f"mcp-connection {owner.target.describe()}")
        self.client: Client | None = None
        # Set (and replaced) when the server writes something that is not a JSON-RPC message: the requests
        # waiting at that moment fail at once instead of timing out (see taskhub.mcp.stdio).
        self.garbled: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.bad_lines = 0

    async def on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ElicitCompleteNotification):
            self._owner._questions.on_elicitation_complete(message.params.elicitation_id)
        if isinstance(message, mcp_types.ProgressNotification):  # the SDK routed those of calls in flight already
            await self._owner._late_progress(message.params)
        if isinstance(message, BadLine):
            self.bad_lines += 1
            if self.bad_lines <= 10 or self.bad_lines % 1000 == 0:  # a server spewing garbage must not flood the log
                logger.warning("%s: %s (bad line %d)", self._owner.target.describe(), message, self.bad_lines)
            garbled, self.garbled = self.garbled, asyncio.get_running_loop().create_future()
            garbled.set_result(str(message))
        await asyncio.sleep(0)

    async def _hold(self) -> None:
        failure: BaseException | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = self._owner._make_sdk_client(stack, self)
                self.client = await stack.enter_async_context(client)
                self._ready.set_result(self.client)
                await self._closing.wait()
        except BaseException as error:
            failure = error
            if not self._ready.done():
                what = f"connecting to {self._owner.target.describe()}"
                self._ready.set_exception(self._owner._explain(_as_transport_error(error, what)))
        finally:
            if not self.dead.done():
                self.dead.set_result(failure)
            if not self._ready.done():
                self._ready.set_exception(TransportError("connection closed"))

    async def ready(self, timeout: float) -> Client:
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            await self.close()
            raise RequestTimeout(
                f"connecting to {self._owner.target.describe()} took longer than {timeout:g}s"
            ) from None

    async def close(self) -> None:
        self._closing.set()
        if not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
        # A failed connect leaves an exception nobody awaited.
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()


def _as_transport_error(error: BaseException, what: str) -> McpClientError:
    if isinstance(error, McpClientError):
        return error
    leaves = list(_leaf_exceptions(error))
    for leaf in leaves:
        if isinstance(leaf, MCPError):
            return _map_mcp_error(leaf, what)
    return TransportError(f"{what}: transport failure ({_describe(leaves) or type(error).__name__})")


def _describe(errors: list[BaseException]) -> str:
    return mask_urls_in("; ".join(describe_exception(leaf) for leaf in errors[:3]))


def _leaf_exceptions(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaf_exceptions(inner)
    else:
        yield error


def _map_mcp_error(error: MCPError, method: str) -> McpClientError:
    if error.code == mcp_types.PARSE_ERROR:
        # What the SDK answers itself when the server's answer is not JSON-RPC (or is too large, see
        # _cap_json_body); a server has no reason to send it for a request it received well-formed.
        return InvalidResult(f"{method}: the answer is unusable: {excerpt(_parse_failure(error.message))}")
    if error.code == mcp_types.REQUEST_TIMEOUT:
        return RequestTimeout(f"{method}: {error.message}")
    if error.code == mcp_types.CONNECTION_CLOSED and ANOTHER_REQUEST in error.message:
        return InvalidResult(f"{method}: {ANOTHER_REQUEST}")  # see _CheckedEventStream
    if error.code == mcp_types.CONNECTION_CLOSED:
        return TransportError(f"{method}: connection closed")
    return protocol_error(error.code, error.message, error.data, method=method)


_INVALID_JSON = re.compile(r"Invalid JSON: ([^\[\n]{1,200})")


def _parse_failure(message: str) -> str:
    """The SDK's parse failure in one short line: not pydantic's multi-line dump of what the server sent."""
    if invalid := _INVALID_JSON.search(message):
        return f"not valid JSON ({invalid.group(1).strip()})"
    if "validation error" in message:
        return "not a JSON-RPC message"
    return " ".join(message.split())[:300]


class ResponseTooLarge(httpx2.StreamError):
    """A JSON answer past wire.MAX_RESPONSE_BYTES. A StreamError, so the SDK fails just that request."""


ANOTHER_REQUEST = "the answer's JSON-RPC id is not the request's"


class ResponseToAnotherRequest(httpx2.StreamError):
    """A JSON answer whose JSON-RPC id is not the request's: the SDK would drop it, and the request wait for nothing."""


class EventToAnotherRequest(httpx2.SSEError):
    """A response on a request's event stream under another id. An SSEError, so that the SDK fails that request
    (as a closed connection, which _map_mcp_error tells apart by the message)."""


class _CheckedEventStream(httpx2.AsyncByteStream):
    """A request's event stream, its responses' ids checked: the SDK gives any response there the request's id."""

    def __init__(self, inner: httpx2.AsyncByteStream, request_id: Any) -> None:
        self._inner = inner
        self._request_id = str(request_id)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        partial = b""
        async for chunk in self._inner:
            *lines, partial = (partial + chunk).split(b"\n")
            if len(partial) > wire.MAX_RESPONSE_BYTES:
                partial = b""  # a line that long is the SDK's to refuse
            for line in lines:
                if line.startswith(b"data:") and b'"id"' in line and self._answers_another(_json_or_none(line[5:])):
                    raise EventToAnotherRequest(ANOTHER_REQUEST)
            yield chunk

    def _answers_another(self, message: Any) -> bool:
        is_response = isinstance(message, dict) and "id" in message and "method" not in message
        return is_response and str(message["id"]) != self._request_id

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, *, request_id: Any = None) -> None:
        self._inner = inner
        self._limit = limit
        self._request_id = request_id

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        chunks: list[bytes] = []
        async for chunk in self._inner:
            received += len(chunk)
            if received > self._limit:
                raise ResponseTooLarge(f"the answer is larger than {self._limit} bytes")
            if self._request_id is not None:
                chunks.append(chunk)
            yield chunk
        if self._request_id is not None:
            answer = _json_or_none(b"".join(chunks))
            # Left to the SDK when it is no JSON-RPC response at all: it says so itself.
            if isinstance(answer, dict) and "id" in answer and str(answer["id"]) != str(self._request_id):
                raise ResponseToAnotherRequest(ANOTHER_REQUEST)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _cap_json_body(response: httpx2.Response) -> None:
    """The SDK reads a JSON answer whole, however large: read at most MAX_RESPONSE_BYTES of it.

    Event streams are not capped (a subscription's stream is long-lived, and each of its events is small), but a
    request's has its responses' ids checked.
    """
    content_type = response.headers.get("content-type", "").lower()
    if not isinstance(response.stream, httpx2.AsyncByteStream):
        return
    if content_type.startswith("application/json"):
        response.stream = _CappedStream(response.stream, wire.MAX_RESPONSE_BYTES, request_id=_request_id(response))
    elif content_type.startswith("text/event-stream") and (request_id := _request_id(response)) is not None:
        response.stream = _CheckedEventStream(response.stream, request_id)


def _request_id(response: httpx2.Response) -> Any:
    """The JSON-RPC id of the request `response` answers (None for a notification, or a GET)."""
    try:
        request = _json_or_none(response.request.content) if response.request.method == "POST" else None
    except httpx2.RequestNotRead:  # a streamed request body: nothing to compare with
        return None
    return request.get("id") if isinstance(request, dict) else None


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


# --- the client -----------------------------------------------------------------------------------


class TasksClient:
    """Speak the Tasks extension to one server.

    ```python
    async with TasksClient(HttpTarget(url="http://127.0.0.1:8765/mcp")) as client:
        outcome = await client.call_tool("approval", {"action": "deploy"})
        if isinstance(outcome, TaskCreated):
            snapshot = await client.get_task(outcome.task.task_id)
    ```
    """

    def __init__(
        self,
        target: ServerTarget,
        *,
        timeout: float = 30.0,
        client_info: dict[str, Any] | None = None,
        observer: ProcessObserver | None = None,
        declare_tasks: bool = True,
    ):
        self.target = target
        # False: requests do not declare the Tasks extension, so the server answers as to a client without it (a
        # result, or -32021 for a tool that needs a task); the gateway's calls for agents that did not declare it.
        self.declare_tasks = declare_tasks
        self.timeout = timeout
        self.observer = observer  # a stdio target's process is watched through it
        self.client_info = client_info or CLIENT_INFO
        self._extension = TasksClientExtension()
        self._connection: _Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._discover_result: mcp_types.DiscoverResult | None = None
        self._last_http_refusal: int | None = None
        # Whether that refusal came with an OAuth Bearer challenge (WWW-Authenticate: Bearer …): the server wants
        # an access token, which an admin gets by connecting it (issue 33).
        self._last_bearer_challenge = False
        self._tool_schemas: dict[str, Any] = {}
        self._task_support: dict[str, str | None] = {}
        self._questions = Questions(target.describe)
        self._own_answers = target.own_answers
        self._session_task_progress: dict[str, ProgressFnT] = {}

    async def __aenter__(self) -> TasksClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    # -- connection management ----------------------------------------------------------------

    def _make_sdk_client(self, stack: contextlib.AsyncExitStack, connection: _Connection) -> Client:
        target = self.target
        if isinstance(target, HttpTarget):
            client = http_client(target, timeout=self.timeout)
            client.event_hooks["response"].extend([self._note_http_status, _cap_json_body])
            stack.push_async_callback(client.aclose)
            transport: Any = streamable_http_client(target.url, http_client=client)
        else:
            transport = stdio_transport(
                command=target.command, args=list(target.args), env=target.env, cwd=target.cwd, observer=self.observer
            )
        # After the first successful negotiation, reconnects adopt the cached result instead of probing.
        mode = self._discover_result and wire.PROTOCOL_VERSION in self._discover_result.supported_versions
        client = Client(
            transport,
            read_timeout_seconds=self.timeout,
            client_info=mcp_types.Implementation.model_validate(self.client_info),
            elicitation_callback=self._questions.on_elicitation,
            sampling_callback=self._sample if self._own_answers.sampling else None,
            list_roots_callback=self._list_roots,
            logging_callback=self._questions.on_log,
            message_handler=connection.on_message,
            extensions=[self._extension] if self.declare_tasks else [],
            mode=wire.PROTOCOL_VERSION if mode else "auto",
            prior_discover=self._discover_result if mode else None,
            cache=None,
        )
        # 2025-11-25: taskhub runs tools as tasks of that revision (tools/call with `task`); it takes no task-augmented
        # requests from servers, so the capability lists none.
        sdk_private.shape_capabilities(client, session_tasks=mcp_types.ClientTasksCapability())
        return client

    async def _list_roots(self, context: Any) -> mcp_types.ListRootsResult:
        return self._own_answers.roots_result()

    async def _sample(self, context: Any, params: Any) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        if not self._own_answers.sampling:  # declined since this session declared it
            return mcp_types.ErrorData(code=SAMPLING_REFUSED, message="Sampling is declined for this server")
        return await self._questions.on_sampling(context, params)

    async def use_own_answers(self, own_answers: OwnAnswers) -> None:
        """Answer the server's own requests as `own_answers` says from now on; when its roots changed, tell a live
        session (`notifications/roots/list_changed`). Whether sampling is offered was declared at `initialize`: a
        change of it counts from the next connection (`sampling/createMessage` is refused at once meanwhile)."""
        before, self._own_answers = self._own_answers, own_answers
        connection = self._connection
        if before.roots == own_answers.roots or connection is None or connection.client is None:
            return
        if connection.dead.done():
            return
        with contextlib.suppress(Exception):  # a session going away takes the news with it
            await connection.client.session.send_notification(mcp_types.RootsListChangedNotification())

    async def _note_http_status(self, response: httpx2.Response) -> None:
        self._last_http_refusal = response.status_code if response.status_code in (401, 403) else None
        challenge = response.headers.get("www-authenticate", "") if self._last_http_refusal else ""
        self._last_bearer_challenge = challenge[:7].lower() == "bearer " or challenge.lower() == "bearer"

    def _explain(self, error: McpClientError) -> McpClientError:
        """The SDK turns an HTTP 401/403 without a JSON-RPC body into a bare -32603; say what it was."""
        refused = self._last_http_refusal
        if isinstance(error, ProtocolError) and error.code == mcp_types.INTERNAL_ERROR and refused is not None:
            reason = "Unauthorized" if refused == 401 else "Forbidden"
            return AuthorizationFailed(
                error.code,
                f"HTTP {refused} {reason}: the server refused the credentials (check the token or headers)",
                {"httpStatus": refused, "bearerChallenge": self._last_bearer_challenge},
                method=error.method,
            )
        return error

    async def _client(self) -> tuple[_Connection, Client]:
        async with self._connect_lock:
            connection = self._connection
            if connection is None or connection.dead.done():
                if connection is not None:
                    await connection.close()
                connection = self._connection = _Connection(self)
            client = await connection.ready(self.timeout)
            if self._discover_result is None and client.session.discover_result is not None:
                self._discover_result = client.session.discover_result
            return connection, client

    async def _drop(self, connection: _Connection) -> None:
        if self._connection is connection:
            self._connection = None
        await connection.close()

    async def _lost(self, connection: _Connection, method: str) -> TransportError:
        """Retire a dead connection and say why it died, as far as the SDK tells."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(connection.dead), 1.0)
        await self._drop(connection)
        cause = connection.dead.result() if connection.dead.done() else None
        leaves = (
            [leaf for leaf in _leaf_exceptions(cause) if not isinstance(leaf, asyncio.CancelledError)] if cause else []
        )
        detail = f" ({_describe(leaves)})" if leaves else ""
        # Only a refusal of this request itself says it did not run: during a long call the connection may die of
        # another request's (an answer to the server's question, sent while the call runs).
        refused = any(isinstance(leaf, AuthorizationProblem) and leaf.method == method for leaf in leaves)
        kind = AuthorizationIncomplete if refused else TransportError
        return kind(f"{method}: connection to {self.target.describe()} lost{detail}")

    async def _request(self, method: str, send: Any, *, deadline: PausableDeadline | None = None) -> Any:
        """Run `send(client)` on a live connection; map every failure to a typed error. `deadline`: the call's own,
        which stops while a question of the call waits for its answer (taskhub.mcp.questions)."""
        connection, client = await self._client()
        garbled = connection.garbled
        call = asyncio.ensure_future(send(client))
        try:
            done = await self._wait(call, connection, garbled, deadline)
        except asyncio.CancelledError:
            call.cancel()
            raise
        if call not in done and garbled in done:
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            if not connection.dead.done():
                raise InvalidResult(f"{method}: while waiting for the answer, {garbled.result()}")
        if call not in done:
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            if connection.dead.done():
                raise await self._lost(connection, method)
            raise RequestTimeout(f"{method}: no answer within {self.timeout:g}s")
        try:
            return call.result()
        except MCPError as error:
            mapped = self._explain(_map_mcp_error(error, method))
            if isinstance(mapped, TransportError):
                raise await self._lost(connection, method) from error
            raise mapped from error
        except ValidationError as error:
            raise InvalidResult(f"{method}: {validation_summary(error)}") from error
        except McpClientError:
            raise
        except (asyncio.CancelledError, Exception) as error:
            # The SDK surfaces a dead transport as a cancellation or a raw network error.
            if isinstance(error, asyncio.CancelledError) or connection.dead.done():
                raise await self._lost(connection, method) from error
            await self._drop(connection)
            raise _as_transport_error(error, method) from error

    async def _wait(
        self, call: asyncio.Future, connection: _Connection, garbled: asyncio.Future, deadline: PausableDeadline | None
    ) -> set[asyncio.Future]:
        ends = {call, connection.dead, garbled}
        if deadline is None:
            done, _ = await asyncio.wait(ends, timeout=self.timeout + 1, return_when="FIRST_COMPLETED")
            return done
        while True:
            deadline.changed.clear()
            changed = asyncio.ensure_future(deadline.changed.wait())
            try:
                done, _ = await asyncio.wait(
                    {*ends, changed}, timeout=deadline.remaining(), return_when="FIRST_COMPLETED"
                )
            finally:
                changed.cancel()
            if done - {changed} or (not done and deadline.remaining() == 0):
                return done - {changed}

    # -- protocol methods -----------------------------------------------------------------------

    async def answers(self) -> None:
        """Whether the server answers, on this client's connection (made if there is none): one `server/discover`,
        as the 2026-07-28 revision has no `ping` (on an `initialize` session, its cached result: no request)."""

        async def send(client: Client) -> None:
            if client.session.discover_result is not None:
                await client.session.send_discover(client.protocol_version)

        await self._request("server/discover", send)

    async def discover(self) -> Discovery:
        """Capabilities (extensions included) and the tool list, from `server/discover` or `initialize`."""

        async def send(client: Client) -> Discovery:
            session = client.session
            if session.discover_result is not None:
                raw = await session.send_discover(client.protocol_version)
                capabilities = raw.get("capabilities") or {}
                meta = raw.get("_meta") or {}
                server_info = meta.get("io.modelcontextprotocol/serverInfo")
            else:
                initialize = session.initialize_result
                assert initialize is not None
                raw = initialize.model_dump(by_alias=True, mode="json", exclude_none=True)
                capabilities = raw.get("capabilities") or {}
                server_info = raw.get("serverInfo")
            tools = await self._list_tools(client) if "tools" in capabilities else []
            return Discovery(
                protocol_version=client.protocol_version,
                server_info=server_info if isinstance(server_info, dict) else None,
                capabilities=capabilities if isinstance(capabilities, dict) else {},
                tools=tools,
                raw=raw,
            )

        return await self._request("server/discover", send)

    async def _list_tools(self, client: Client) -> list[dict[str, Any]]:
        session = client.session
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang discovery
            request = mcp_types.ListToolsRequest(params=mcp_types.PaginatedRequestParams(cursor=cursor))
            page = await self._send_tolerant(session, request)
            raw_tools = [tool for tool in page.get("tools") or [] if isinstance(tool, dict)]
            cursor = page.get("nextCursor") if isinstance(page.get("nextCursor"), str) else None
            try:
                # The session's own state (output schemas, its `Mcp-Param-*` map); the tools it drops for invalid
                # `x-mcp-header` annotations stay in our listing, marked by `learn_tools`, and are refused by
                # `call_tool` with the reason, not silently missing.
                listing = mcp_types.ListToolsResult.model_validate({**page, "tools": raw_tools})
                sdk_private.absorb_tool_listing(session, listing, complete=cursor is None)
            except ValidationError:
                logger.warning("tools/list from %s does not validate; listing it as sent", self.target.describe())
            tools.extend(raw_tools)
            if not cursor:
                break
        self.learn_tools(tools)
        return tools

    def learn_tools(self, tools: Any) -> None:
        """Remember the input schemas of `tools` (a `tools/list` as sent or as stored, e.g. a server's catalogue:
        untrusted), so that `call_tool` mirrors their `x-mcp-header` arguments into `Mcp-Param-*` headers and
        refuses a tool whose annotations are invalid. A later listing wins over an earlier one."""
        for tool in tools if isinstance(tools, list) else []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self._tool_schemas[tool["name"]] = tool.get("inputSchema")
                self._task_support[tool["name"]] = session_tasks.task_support(tool)

    def check_tool(self, name: str) -> None:
        """Raise InvalidToolDefinition when the tool, as last listed, must not be called (SEP-2243)."""
        if name in self._tool_schemas and (problem := header_problem(self._tool_schemas[name])) is not None:
            raise InvalidToolDefinition(
                f"the tool {name[:120]!r} cannot be called: its x-mcp-header annotations are invalid ({problem})"
            )

    async def _send_tolerant(
        self,
        session: Any,
        request: Any,
        *,
        headers: Mapping[str, str] | None = None,
        no_timeout: bool = False,
        on_progress: ProgressFnT | None = None,
        extra_params: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """`ClientSession.send_request` without its strict core-result validation.

        The SDK rejects a result without `resultType`, which the spec says a client MUST read as
        "complete"; we validate the result ourselves. Stamping (`_meta`, headers) and the dispatcher
        stay the SDK's own.
        """
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        if extra_params:
            data.setdefault("params", {}).update(extra_params)
        options: dict[str, Any] = {"timeout": None if no_timeout else self.timeout}
        if on_progress is not None:
            options["on_progress"] = on_progress
        if request_id is not None:
            options["request_id"] = request_id  # with on_progress, the progress token too
        sdk_private.stamp_request(session, data, options)
        if headers:
            options.setdefault("headers", {}).update(headers)
        raw = await sdk_private.send_raw_request(session, data["method"], data.get("params"), options)
        if not isinstance(raw, dict):
            raise InvalidResult(f"{data['method']}: expected an object, got {type(raw).__name__}")
        return raw

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        input_responses: dict[str, Any] | None = None,
        request_state: str | None = None,
        asker: Asker | None = None,
        on_progress: ProgressFnT | None = None,
        on_log: LogSink | None = None,
    ) -> CallOutcome:
        """Send `tools/call` once. The answer is a result, an MRTR input request, or a task.

        `asker`: answers the questions the server asks on the call's session while it waits for the result (classic
        `elicitation/create`, taskhub.mcp.questions); the call's timeout stops while one waits for its answer.
        `on_progress(progress, total, message)`: each `notifications/progress` the server sends about the call (the
        request carries a progress token then); values as sent, untrusted. `on_log(level, logger, data)`: each line
        the server logs (`notifications/message`) while this is the call in flight (with an asker only).

        A tool listed (`discover`) or learnt (`learn_tools`) with `x-mcp-header` annotations gets its arguments
        mirrored into `Mcp-Param-*` headers on a 2026-07-28 HTTP connection; one whose annotations are invalid is
        refused (InvalidToolDefinition) before anything is sent."""
        self.check_tool(name)

        async def send(client: Client) -> CallOutcome:
            params = mcp_types.CallToolRequestParams(
                name=name, arguments=arguments or {}, input_responses=input_responses, request_state=request_state
            )
            headers = None
            if isinstance(self.target, HttpTarget) and client.protocol_version == wire.PROTOCOL_VERSION:
                headers = param_headers(self._tool_schemas.get(name), arguments or {})
            request = mcp_types.CallToolRequest(params=params)
            as_task = self._runs_as_session_task(client, name)
            # A task's progress comes after the call answered, with the call's token (the request id): one we know.
            token = f"taskhub-{uuid.uuid4().hex}" if as_task and on_progress is not None else None
            # With an asker the call's deadline is ours (paused while a question waits), not the SDK's.
            raw = await self._send_tolerant(
                client.session,
                request,
                headers=headers,
                no_timeout=asker is not None,
                on_progress=on_progress,
                extra_params={"task": {}} if as_task else None,
                request_id=token,
            )
            if as_task and session_tasks.is_task_handle(raw):
                task = session_tasks.snapshot_of(raw["task"], source="tools/call")
                return TaskCreated(task=task, on_session=True, progress_token=token)
            return parse_call_tool_result(raw)

        if asker is None:
            return await self._request("tools/call", send)
        deadline = PausableDeadline(self.timeout + 1)
        token = self._questions.open(asker, deadline, on_log=on_log)
        try:
            return await self._request("tools/call", send, deadline=deadline)
        finally:
            self._questions.close(token)

    def _runs_as_session_task(self, client: Client, name: str) -> bool:
        """A 2025-11-25 session whose server runs tool calls as tasks, and a tool that may run as one."""
        initialized = client.session.initialize_result
        if initialized is None or initialized.protocol_version != session_tasks.VERSION:
            return False
        capabilities = initialized.model_dump(by_alias=True, mode="json", exclude_none=True).get("capabilities") or {}
        support = self._task_support.get(name)
        return session_tasks.server_runs_tool_calls_as_tasks(capabilities) and support in session_tasks.AUGMENTABLE

    async def _session_request(
        self, method: str, params: dict[str, Any], *, deadline: PausableDeadline | None = None
    ) -> Any:
        async def send(client: Client) -> Any:
            data: dict[str, Any] = {"method": method, "params": dict(params)}
            options: dict[str, Any] = {"timeout": None if deadline is not None else self.timeout}
            sdk_private.stamp_request(client.session, data, options)
            return await sdk_private.send_raw_request(client.session, method, data.get("params"), options)

        return await self._request(method, send, deadline=deadline)

    async def get_session_task(self, task_id: str) -> TaskSnapshot:
        """`tasks/get` of a 2025-11-25 task: its status, without result or questions."""
        snapshot = session_tasks.snapshot_of(
            await self._session_request("tasks/get", {"taskId": task_id}), source="tasks/get"
        )
        if snapshot.task_id != task_id:
            raise InvalidResult(f"tasks/get answered about another task, {snapshot.task_id[:80]!r}")
        return snapshot

    async def cancel_session_task(self, task_id: str) -> TaskSnapshot:
        return session_tasks.snapshot_of(
            await self._session_request("tasks/cancel", {"taskId": task_id}), source="tasks/cancel"
        )

    @contextlib.contextmanager
    def session_task_statuses(self, task_id: str) -> Iterator[session_tasks.StatusNotices]:
        """The `notifications/tasks/status` the server sends about a 2025-11-25 task, while in this block."""
        notices = self._extension.session_task_notices[task_id] = session_tasks.StatusNotices()
        try:
            yield notices
        finally:
            if self._extension.session_task_notices.get(task_id) is notices:
                del self._extension.session_task_notices[task_id]

    @contextlib.contextmanager
    def session_task_progress(self, token: str | None, on_progress: ProgressFnT | None) -> Iterator[None]:
        """The `notifications/progress` the server sends with `token` (TaskCreated.progress_token) go to
        `on_progress` while in this block."""
        if token is None or on_progress is None:
            yield
            return
        self._session_task_progress[token] = on_progress
        try:
            yield
        finally:
            self._session_task_progress.pop(token, None)

    async def _late_progress(self, params: mcp_types.ProgressNotificationParams) -> None:
        token = params.progress_token
        on_progress = self._session_task_progress.get(token) if isinstance(token, str) else None
        if on_progress is not None:
            await on_progress(params.progress, params.total, params.message)

    async def session_task_result(
        self, task_id: str, *, wait_seconds: float, asker: Asker | None = None, on_log: LogSink | None = None
    ) -> dict[str, Any]:
        """`tasks/result` of a 2025-11-25 task: waits (up to `wait_seconds`, paused while a question waits for its
        answer) until the task ends and returns the call's result; a JSON-RPC error is raised as ProtocolError. The
        task's questions (requests related to it) go to `asker` meanwhile."""
        deadline = PausableDeadline(wait_seconds)
        token = (
            self._questions.open(asker, deadline, related_task=task_id, on_log=on_log) if asker is not None else None
        )
        try:
            raw = await self._session_request("tasks/result", {"taskId": task_id}, deadline=deadline)
        finally:
            if token is not None:
                self._questions.close(token)
        if not isinstance(raw, dict):
            raise InvalidResult(f"tasks/result: expected an object, got {type(raw).__name__}")
        return raw

    async def get_task(self, task_id: str) -> TaskSnapshot:
        async def send(client: Client) -> TaskSnapshot:
            raw = await client.session.send_request(
                GetTaskRequest(params=TaskIdParams(task_id=task_id)), _RAW, request_read_timeout_seconds=self.timeout
            )
            snapshot = wire.parse_get_task_result(raw)
            if snapshot.task_id != task_id:
                raise InvalidResult(f"tasks/get answered about another task, {snapshot.task_id[:80]!r}")
            return snapshot

        return await self._request("tasks/get", send)

    async def update_task(self, task_id: str, input_responses: dict[str, Any]) -> None:
        async def send(client: Client) -> None:
            params = UpdateTaskParams(task_id=task_id, input_responses=input_responses)
            wire.parse_ack(
                await client.session.send_request(
                    UpdateTaskRequest(params=params), _RAW, request_read_timeout_seconds=self.timeout
                ),
                method="tasks/update",
            )

        await self._request("tasks/update", send)

    async def cancel_task(self, task_id: str) -> None:
        async def send(client: Client) -> None:
            raw = await client.session.send_request(
                CancelTaskRequest(params=TaskIdParams(task_id=task_id)), _RAW, request_read_timeout_seconds=self.timeout
            )
            wire.parse_ack(raw, method="tasks/cancel")

        await self._request("tasks/cancel", send)

    async def follow(
        self, task: TaskSnapshot, *, default_poll_interval_ms: int = 1000, min_poll_interval_ms: int = 50
    ) -> AsyncIterator[TaskSnapshot]:
        """Poll `task` until it ends, yielding every snapshot whose content changed.

        Waits the latest `pollIntervalMs` between polls (re-read from every answer). Change is judged on
        the whole snapshot minus `lastUpdatedAt`, which some peers bump on every read.
        """
        last = _comparable(task)
        snapshot = task
        while not snapshot.is_terminal:
            interval_ms = max(snapshot.poll_interval_ms or default_poll_interval_ms, min_poll_interval_ms)
            await asyncio.sleep(interval_ms / 1000)
            snapshot = await self.get_task(task.task_id)
            current = _comparable(snapshot)
            if current != last:
                last = current
                yield snapshot

    @contextlib.asynccontextmanager
    async def listen(self, task_ids: Sequence[str]) -> AsyncIterator[TaskSubscription]:
        """Open `subscriptions/listen` for `task_ids`; iterate the subscription for `notifications/tasks`."""
        connection, client = await self._client()
        session = client.session
        request_id = f"tasks-listen-{next(_listen_ids)}"
        request = mcp_types.SubscriptionsListenRequest(
            params=mcp_types.SubscriptionsListenRequestParams(
                notifications=mcp_types.SubscriptionFilter.model_validate({"taskIds": list(task_ids)})
            )
        )
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        options: dict[str, Any] = {"request_id": request_id}
        # The SDK's listen() knows only core filters; a task filter is the same request with `taskIds`,
        # sent through the session's own stamp and dispatcher so `_meta` and headers stay the SDK's.
        sdk_private.stamp_request(session, data, options)
        subscription = TaskSubscription(request_id=request_id)
        self._extension.routes[request_id] = subscription
        route = sdk_private.register_listen_route(session, request_id)

        async def drive() -> None:
            try:
                await sdk_private.send_raw_request(session, data["method"], data.get("params"), options)
                subscription._end(None)
            except MCPError as error:
                subscription._end(_map_mcp_error(error, "subscriptions/listen"))
            except Exception as error:
                subscription._end(_as_transport_error(error, "subscriptions/listen"))
            finally:
                sdk_private.settle_listen_route(route, "graceful")

        driver = asyncio.ensure_future(drive())
        try:
            acked = asyncio.ensure_future(sdk_private.wait_listen_acknowledged(route))
            await asyncio.wait({acked, connection.dead}, timeout=self.timeout, return_when="FIRST_COMPLETED")
            acked.cancel()
            honored_filter = sdk_private.listen_route_honored(route)
            if honored_filter is None:
                if subscription._error is not None:
                    raise subscription._error
                if connection.dead.done():
                    raise await self._lost(connection, "subscriptions/listen")
                raise RequestTimeout(f"subscriptions/listen: no acknowledgement within {self.timeout:g}s")
            honored = (honored_filter.model_extra or {}).get("taskIds")
            subscription.accepted_task_ids = [t for t in honored or [] if isinstance(t, str)]
            watcher = asyncio.ensure_future(_end_when_dead(connection, subscription))
            try:
                yield subscription
            finally:
                watcher.cancel()
        finally:
            sdk_private.settle_listen_route(route, "local")
            driver.cancel()
            with contextlib.suppress(BaseException):
                await driver
            sdk_private.unregister_listen_route(session, request_id)
            self._extension.routes.pop(request_id, None)


async def _end_when_dead(connection: _Connection, subscription: TaskSubscription) -> None:
    await asyncio.shield(connection.dead)
    subscription._end(TransportError("subscriptions/listen: connection lost"))


_END = object()
# Snapshots waiting to be read are kept per task (the latest only), for this many tasks at most.
MAX_PENDING_TASKS = 10_000


class TaskSubscription:
    """An open task subscription: `async for snapshot in subscription` yields each `notifications/tasks`.

    The loop ends when the server closes the stream gracefully; it raises a typed error when the
    stream is lost. A reader slower than the server gets, per task, the latest snapshot only: a flood
    costs memory per task, not per notification, and the last word is never dropped. A notification
    that is not a valid task is not yielded: `on_problem(task_id, problem)` hears of it (task_id is
    whatever the notification said, or None).
    """

    def __init__(self, *, request_id: str) -> None:
        self.request_id = request_id
        self.accepted_task_ids: list[str] = []
        self.on_problem: Callable[[Any, str], None] = self._log_problem
        self._pending: dict[str, TaskSnapshot] = {}
        self._ready: asyncio.Queue[Any] = asyncio.Queue()
        self._error: McpClientError | None = None
        self._ended = False
        self._dropped = 0

    def _deliver(self, snapshot: TaskSnapshot) -> None:
        if self._ended:
            return
        task_id = snapshot.task_id
        waiting = self._pending.get(task_id)
        if waiting is not None and waiting.is_terminal:
            return  # a task's last word stays its last word
        if waiting is None:
            if len(self._pending) >= MAX_PENDING_TASKS:
                self._dropped += 1
                if self._dropped == 1:
                    logger.warning(
                        "task subscription %s: too many tasks waiting; dropping notifications", self.request_id
                    )
                return
            self._ready.put_nowait(task_id)
        self._pending[task_id] = snapshot

    def _problem(self, task_id: Any, problem: str) -> None:
        if not self._ended:
            self.on_problem(task_id, problem)

    def _log_problem(self, task_id: Any, problem: str) -> None:
        logger.info(
            "task subscription %s: ignored a malformed notification (%.80r): %s", self.request_id, task_id, problem
        )

    def _end(self, error: McpClientError | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        self._ready.put_nowait(_END)

    def __aiter__(self) -> TaskSubscription:
        return self

    async def __anext__(self) -> TaskSnapshot:
        item = await self._ready.get()
        if item is _END:
            self._ready.put_nowait(_END)
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return self._pending.pop(item)


def parse_call_tool_result(raw: dict[str, Any]) -> CallOutcome:
    """Branch a `tools/call` answer on `resultType`: absent or "complete", "input_required", or "task"."""
    result_type = raw.get("resultType", "complete")
    try:
        if result_type == "task":
            return TaskCreated(task=CreateTaskResult.model_validate(raw).to_snapshot())
        if result_type == "input_required":
            parsed = mcp_types.InputRequiredResult.model_validate(raw)
            requests = raw.get("inputRequests") or {}
            if any(len(key) > wire.MAX_INPUT_KEY_CHARS for key in requests):
                raise InvalidResult(f"tools/call: an inputRequests key is longer than {wire.MAX_INPUT_KEY_CHARS}")
            return ToolInputRequired(input_requests=dict(requests), request_state=parsed.request_state)
        if result_type == "complete":
            mcp_types.CallToolResult.model_validate(raw)
            result = {key: value for key, value in raw.items() if key not in ("resultType", "_meta")}
            result.setdefault("isError", False)
            return ToolCompleted(result=result)
    except ValidationError as error:
        raise InvalidResult(f"tools/call: malformed {result_type!r} result: {wire.first_error(error)}") from error
    raise InvalidResult(f"tools/call: unknown resultType {str(result_type)[:80]!r}")


def _comparable(snapshot: TaskSnapshot) -> dict[str, Any]:
    wire_form = snapshot.to_wire()
    wire_form.pop("lastUpdatedAt", None)
    return wire_form
