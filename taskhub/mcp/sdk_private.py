"""Every private name of the `mcp` SDK (2.3) taskhub uses, each behind one small function.

Nothing else in taskhub touches an underscore name of the SDK, or state its docstrings call package-internal.
Each docstring says which private name it reaches and what public API is missing. tests/test_sdk_private.py
calls every function here against real SDK objects (a real client session with the demo server, a real
server process), so that an SDK upgrade that renames or changes one of them fails there first, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import mcp_types
from mcp.client import stdio as sdk_stdio

# `mcp.client._transport.TransportStreams`, what a transport context manager yields (read stream, write
# stream). Missing: a public name for it; `mcp.client.Transport` is public, its element type is not.
from mcp.client._transport import TransportStreams
from mcp.client.session import HANDSHAKE_PROTOCOL_VERSIONS

if TYPE_CHECKING:
    from mcp.client import ClientSession
    from mcp.client.subscriptions import ListenRoute
    from mcp.shared.dispatcher import CallOptions

__all__ = [
    "OAUTH_PROVIDER_HOOKS",
    "TransportStreams",
    "absorb_tool_listing",
    "drain_stdout",
    "handle_token_response",
    "initialize_provider",
    "listen_route_honored",
    "perform_authorization",
    "provider_initialized",
    "register_listen_route",
    "send_raw_request",
    "settle_listen_route",
    "shape_capabilities",
    "stamp_request",
    "stop_server_process",
    "unregister_listen_route",
    "wait_listen_acknowledged",
]


# --- requests without the SDK's result validation --------------------------------------------------


def stamp_request(session: ClientSession, data: dict[str, Any], options: CallOptions) -> None:
    """Add what the session puts on every request it sends (`_meta`: protocol version, client info and
    capabilities; routing headers) to a request dumped as a dict, in place. `ClientSession._stamp`.

    Missing: a public way to send a request whose result the SDK does not validate as a core result
    (`send_request` rejects a result without `resultType`, which the spec reads as "complete"), or a
    `subscriptions/listen` with a filter key of an extension (`Client.listen` knows only core filters)."""
    session._stamp(data, options)


async def send_raw_request(
    session: ClientSession, method: str, params: Mapping[str, Any] | None, options: CallOptions
) -> dict[str, Any]:
    """Send a stamped request on the session's own connection and return its raw result dict.
    `ClientSession._dispatcher.send_raw_request`.

    Missing: the same as for `stamp_request`: a public raw send on the session."""
    return await session._dispatcher.send_raw_request(method, params, options)


def absorb_tool_listing(
    session: ClientSession, listing: mcp_types.ListToolsResult, *, complete: bool
) -> mcp_types.ListToolsResult:
    """Let the session take in a `tools/list` page fetched with `send_raw_request`: it drops tools whose
    `x-mcp-header` annotations are invalid (a 2026-07-28 MUST) and remembers the others' so that `tools/call`
    mirrors them into `Mcp-Param-*` headers. `ClientSession._absorb_tool_listing`.

    Missing: a public `list_tools` without the strict core-result validation, or a public absorb."""
    return session._absorb_tool_listing(listing, complete=complete)


# --- a task subscription on the session's listen routing -------------------------------------------


def register_listen_route(session: ClientSession, request_id: str) -> ListenRoute:
    """Route the acknowledgement and the end of the `subscriptions/listen` request `request_id` to a new route;
    call before sending it. `ClientSession._register_listen_route`.

    Missing: `Client.listen` with an extension's filter keys (`taskIds`): it builds a core filter, which
    drops them."""
    return session._register_listen_route(request_id)


def unregister_listen_route(session: ClientSession, request_id: str) -> None:
    """Drop the route of `request_id` (a no-op when it is gone). `ClientSession._unregister_listen_route`.

    Missing: as for `register_listen_route`."""
    session._unregister_listen_route(request_id)


async def wait_listen_acknowledged(route: ListenRoute) -> None:
    """Return once the server acknowledged the subscription or it ended. `ListenRoute.acked`, state the SDK
    calls package-internal.

    Missing: as for `register_listen_route`."""
    await route.acked.wait()


def listen_route_honored(route: ListenRoute) -> mcp_types.SubscriptionFilter | None:
    """The filter the server acknowledged (an extension's keys in `model_extra`), None before an
    acknowledgement. `ListenRoute.honored`, package-internal.

    Missing: as for `register_listen_route`."""
    return route.honored


def settle_listen_route(route: ListenRoute, end: Literal["graceful", "local"]) -> None:
    """Record how the subscription ended ("graceful": the server answered the request; "local": we closed
    it); the first end wins. `ListenRoute.settle`, package-internal.

    Missing: as for `register_listen_route`."""
    route.settle(end)


# --- a stdio server process --------------------------------------------------------------------------


async def drain_stdout(process: Any) -> None:
    """Read and drop what is left on a server process's stdout (shielded, until shutdown closes the pipe),
    so a server flushing buffered output does not block on a full pipe instead of exiting.
    `mcp.client.stdio._drain_stdout`.

    Missing: public process helpers for a transport that reads stdout itself (`stdio_client` has no hook
    to bound line sizes or route stderr, see taskhub.mcp.stdio)."""
    await sdk_stdio._drain_stdout(process)


async def stop_server_process(process: Any) -> None:
    """Stop a server process as the spec's stdio shutdown says: close its stdin, wait a grace period, then
    kill its whole process tree. `mcp.client.stdio._stop_server_process`.

    Missing: as for `drain_stdout`."""
    await sdk_stdio._stop_server_process(process)


# --- the capabilities declared at each revision ---------------------------------------------------------


def shape_capabilities(client: Any, *, session_tasks: mcp_types.ClientTasksCapability) -> None:
    """Make `client` (an un-entered `mcp.client.Client`) declare `session_tasks` as its `tasks` capability in a
    2025-11-25 handshake, and no `roots` or `sampling` at the revisions after the handshake ones (2026-07-28 deprecates
    both; taskhub answers them on the 2025 sessions only, and a modern request's `_meta` stays what it was, which the
    tracker's lean path sends byte for byte). Wraps `Client._build_session` and, on the session it builds,
    `ClientSession._build_capabilities`.

    Missing: a public way to shape the capability ad per revision (the SDK builds it from its callbacks and
    extensions only)."""
    build_session = client._build_session

    async def build(exit_stack: Any) -> Any:
        session = await build_session(exit_stack)
        build_capabilities = session._build_capabilities

        def shaped(version: str) -> mcp_types.ClientCapabilities:
            built = build_capabilities(version)
            if version == SESSION_TASKS_VERSION:
                return built.model_copy(update={"tasks": session_tasks})
            if version not in HANDSHAKE_PROTOCOL_VERSIONS:
                return built.model_copy(update={"roots": None, "sampling": None})
            return built

        session._build_capabilities = shaped
        return session

    client._build_session = build


SESSION_TASKS_VERSION = "2025-11-25"


# --- the OAuth client's hooks (taskhub/mcp/oauth.py, taskhub/mcp/oauth_browser.py, taskhub/servers/oauth_store.py) --

# The methods of the SDK's `OAuthClientProvider` (mcp.client.auth) that taskhub's providers override, each calling
# the SDK's own through the functions below. Missing: public hooks for "the flow starts" (keep discovery, load kept
# tokens), "a person must authorize now" (step-up scopes, an admin's Connect split in two) and "the token endpoint
# answered" (a refused client marks its server).
OAUTH_PROVIDER_HOOKS = ("_initialize", "_perform_authorization", "_handle_token_response")


async def initialize_provider(cls: type, provider: Any) -> None:
    """The SDK's `_initialize` of `provider`, from the override in `cls` (`super(cls, provider)._initialize()`)."""
    await super(cls, provider)._initialize()


async def perform_authorization(cls: type, provider: Any) -> Any:
    """The SDK's `_perform_authorization` of `provider` (the request of the grant it runs), from `cls`'s override."""
    return await super(cls, provider)._perform_authorization()


async def handle_token_response(cls: type, provider: Any, response: Any) -> None:
    """The SDK's `_handle_token_response` of `provider` (keeps the tokens of a token endpoint's answer)."""
    await super(cls, provider)._handle_token_response(response)


def provider_initialized(provider: Any) -> bool:
    """Whether `provider` has loaded its stored tokens: `OAuthClientProvider._initialized`."""
    return bool(provider._initialized)
