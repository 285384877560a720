"""Each private hook of the `mcp` SDK (taskhub/mcp/sdk_private.py) against real SDK objects: a real client
session with the demo server over HTTP, a real demo server process over stdio.

An SDK upgrade that renames, removes or changes one of them fails here, with the hook's name in the message,
before it fails somewhere deep in the client or the tracker.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import itertools
import subprocess
import typing
from collections.abc import AsyncIterator, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
from mcp import Client
from mcp.client.stdio import get_default_environment

from taskhub.mcp import sdk_private, wire
from taskhub.mcp.extension import TasksClientExtension, decline_elicitation
from tests.demo_process import DemoServer, stdio_target

pytestmark = pytest.mark.slow

TASKHUB = Path(__file__).resolve().parent.parent / "taskhub"
_listen_ids = itertools.count(1)


@contextlib.contextmanager
def hook(name: str) -> Iterator[None]:
    """Say which hook broke, and with which SDK, when the code inside fails."""
    try:
        yield
    except Exception as error:
        raise AssertionError(
            f"taskhub.mcp.sdk_private.{name} no longer works with mcp {version('mcp')}: "
            f"{type(error).__name__}: {error} (see the hook's docstring for the private name it reaches)"
        ) from error


@pytest.fixture(scope="module")
def demo_server():
    with DemoServer("--poll-interval-ms", "100") as server:
        yield server


@contextlib.asynccontextmanager
async def sdk_session(url: str) -> AsyncIterator[Any]:
    """A real SDK client session with the demo server, declaring the Tasks extension as TasksClient does."""
    client = Client(
        url,
        read_timeout_seconds=15,
        elicitation_callback=decline_elicitation,
        extensions=[TasksClientExtension()],
    )
    async with client:
        yield client.session


def stamped(session: Any, request: Any, options: dict[str, Any]) -> dict[str, Any]:
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    with hook("stamp_request"):
        sdk_private.stamp_request(session, data, options)
    return data


async def send(session: Any, request: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    options = {"timeout": 15, **(options or {})}
    data = stamped(session, request, options)
    with hook("send_raw_request"):
        return await sdk_private.send_raw_request(session, data["method"], data.get("params"), options)


def headers(options: dict[str, Any]) -> dict[str, str]:
    return {name.lower(): value for name, value in options.get("headers", {}).items()}


def listed_tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}}


async def test_stamp_request_puts_the_negotiated_meta_and_headers_on_a_request(demo_server):
    async with sdk_session(demo_server.url) as session:
        options: dict[str, Any] = {}
        data = stamped(session, mcp_types.ListToolsRequest(), options)
    meta = data["params"]["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == wire.PROTOCOL_VERSION
    assert meta["io.modelcontextprotocol/clientCapabilities"]["extensions"] == {wire.EXTENSION_ID: {}}
    assert headers(options)["mcp-method"] == "tools/list"


async def test_send_raw_request_answers_the_raw_result_without_validating_it(demo_server):
    async with sdk_session(demo_server.url) as session:
        raw = await send(session, mcp_types.ListToolsRequest())
    assert isinstance(raw, dict)
    assert "long" in {tool["name"] for tool in raw["tools"]}


async def test_absorb_tool_listing_drops_invalid_header_annotations_and_mirrors_the_valid_ones(demo_server):
    listing = mcp_types.ListToolsResult.model_validate(
        {
            "tools": [
                listed_tool("mirrored", {"region": {"type": "string", "x-mcp-header": "Region"}}),
                listed_tool("invalid", {"region": {"type": "object", "x-mcp-header": "Region"}}),
            ]
        }
    )
    async with sdk_session(demo_server.url) as session:
        with hook("absorb_tool_listing"):
            absorbed = sdk_private.absorb_tool_listing(session, listing, complete=True)
            assert [tool.name for tool in absorbed.tools] == ["mirrored"]
        options: dict[str, Any] = {}
        call = mcp_types.CallToolRequest(
            params=mcp_types.CallToolRequestParams(name="mirrored", arguments={"region": "eu"})
        )
        stamped(session, call, options)
    with hook("absorb_tool_listing"):
        assert headers(options).get("mcp-param-region") == "eu", options["headers"]


async def test_a_listen_route_hears_the_acknowledgement_and_is_settled_and_unregistered(demo_server):
    async with sdk_session(demo_server.url) as session:
        call = mcp_types.CallToolRequest(params=mcp_types.CallToolRequestParams(name="long", arguments={"seconds": 1}))
        task_id = wire.CreateTaskResult.model_validate(await send(session, call)).task_id
        request_id = f"sdk-private-listen-{next(_listen_ids)}"
        listen = mcp_types.SubscriptionsListenRequest(
            params=mcp_types.SubscriptionsListenRequestParams(
                notifications=mcp_types.SubscriptionFilter.model_validate({"taskIds": [task_id]})
            )
        )
        with hook("register_listen_route"):
            route = sdk_private.register_listen_route(session, request_id)
        # Answered (the stream closed gracefully) once the task ends, about a second from now.
        answered = asyncio.ensure_future(send(session, listen, {"request_id": request_id}))
        try:
            with hook("wait_listen_acknowledged"):
                await asyncio.wait_for(sdk_private.wait_listen_acknowledged(route), 15)
            with hook("listen_route_honored"):
                honored = sdk_private.listen_route_honored(route)
                assert honored is not None
                assert (honored.model_extra or {}).get("taskIds") == [task_id]
            assert (await asyncio.wait_for(answered, 15)).get("resultType", "complete") == "complete"
            with hook("settle_listen_route"):
                sdk_private.settle_listen_route(route, "graceful")
                sdk_private.settle_listen_route(route, "local")  # the first end wins; a second is harmless
        finally:
            answered.cancel()
            with hook("unregister_listen_route"):
                sdk_private.unregister_listen_route(session, request_id)
                sdk_private.unregister_listen_route(session, request_id)  # gone already: a no-op

        # A route settled before any acknowledgement wakes its waiter, with nothing honored (how a refused
        # or lost listen request ends TasksClient.listen's wait at once).
        with hook("register_listen_route"):
            unanswered = sdk_private.register_listen_route(session, f"sdk-private-listen-{next(_listen_ids)}")
        with hook("settle_listen_route"):
            sdk_private.settle_listen_route(unanswered, "local")
        with hook("wait_listen_acknowledged"):
            await asyncio.wait_for(sdk_private.wait_listen_acknowledged(unanswered), 1)
        with hook("listen_route_honored"):
            assert sdk_private.listen_route_honored(unanswered) is None


async def test_stop_server_process_ends_a_stdio_server_and_drain_stdout_ends_with_it():
    target = stdio_target()
    process = await anyio.open_process(
        [target.command, *target.args],
        env=get_default_environment() | dict(target.env or {}),
        stderr=subprocess.DEVNULL,
        cwd=target.cwd,
        start_new_session=True,
    )
    assert process.stdout is not None
    async with anyio.create_task_group() as tasks:
        draining = anyio.Event()

        async def drain() -> None:
            with hook("drain_stdout"):
                await sdk_private.drain_stdout(process)
            draining.set()

        tasks.start_soon(drain)
        with anyio.fail_after(20):
            with hook("stop_server_process"):
                await sdk_private.stop_server_process(process)
        with anyio.fail_after(5):
            await draining.wait()
    with hook("stop_server_process"):
        assert process.returncode is not None, "the server process is still running"


async def test_shape_capabilities_declares_tasks_at_2025_11_25_and_no_roots_or_sampling_after(demo_server):
    async def roots(context):
        return mcp_types.ListRootsResult(roots=[])

    async def sample(context, params):
        return mcp_types.ErrorData(code=-1, message="no")

    client = Client(
        demo_server.url,
        read_timeout_seconds=15,
        extensions=[TasksClientExtension()],
        list_roots_callback=roots,
        sampling_callback=sample,
    )
    with hook("shape_capabilities"):
        sdk_private.shape_capabilities(client, session_tasks=mcp_types.ClientTasksCapability())
        async with client:
            legacy = client.session._build_capabilities("2025-11-25").model_dump(by_alias=True, exclude_none=True)
            assert legacy["tasks"] == {} and legacy["roots"] == {"listChanged": True} and "sampling" in legacy
            modern = client.session._build_capabilities("2026-07-28").model_dump(by_alias=True, exclude_none=True)
            assert not {"tasks", "roots", "sampling"} & set(modern)


def test_transport_streams_is_still_a_read_and_a_write_stream():
    with hook("TransportStreams"):
        assert typing.get_origin(sdk_private.TransportStreams) is tuple
        assert len(typing.get_args(sdk_private.TransportStreams)) == 2


def test_the_oauth_providers_hooks_are_still_the_sdks_and_called_through_sdk_private():
    """taskhub's OAuth providers override these methods of the SDK's provider and call the SDK's own through
    sdk_private (its other users, the OAuth tests, walk them against a real authorization server): each must still be
    a coroutine method of every provider class taskhub builds on, and `_initialized` an attribute it sets."""
    import inspect

    from mcp.client.auth import OAuthClientProvider
    from mcp.client.auth.extensions.client_credentials import (
        ClientCredentialsOAuthProvider,
        PrivateKeyJWTOAuthProvider,
    )
    from mcp.shared.auth import OAuthClientMetadata

    for base in (OAuthClientProvider, ClientCredentialsOAuthProvider, PrivateKeyJWTOAuthProvider):
        for hook in sdk_private.OAUTH_PROVIDER_HOOKS:
            assert inspect.iscoroutinefunction(getattr(base, hook, None)), (base.__name__, hook)
    provider = OAuthClientProvider(
        "http://127.0.0.1:9/mcp", OAuthClientMetadata(redirect_uris=None), storage=None, redirect_handler=None
    )
    assert sdk_private.provider_initialized(provider) is False


def _private_names_of_the_sdk(tree: ast.AST) -> set[str]:
    """The SDK's underscore names sdk_private reaches: attributes, and names imported from `mcp` modules."""
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr.startswith("_")}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mcp":
            names.update(alias.name for alias in node.names if alias.name.startswith("_"))
    return names - {"__init__"}


def test_no_other_module_reaches_the_sdks_private_names():
    hooks = TASKHUB / "mcp" / "sdk_private.py"
    private = _private_names_of_the_sdk(ast.parse(hooks.read_text()))
    assert {"_stamp", "_dispatcher", "_absorb_tool_listing", "_drain_stdout"} <= private
    offences = []
    for path in sorted(TASKHUB.rglob("*.py")):
        if path == hooks:
            continue
        source = path.read_text()
        if "mcp" not in source and not any(name in source for name in private):
            continue
        module = path.relative_to(TASKHUB.parent)
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if not isinstance(node, ast.Attribute | ast.ImportFrom | ast.Import):
                continue
            where = f"{module}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr in private:
                offences.append(f"{where}: .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mcp":
                module_private = any(part.startswith("_") for part in node.module.split("."))
                names = [alias.name for alias in node.names if alias.name.startswith("_")]
                if module_private or names:
                    offences.append(f"{where}: from {node.module} import {', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.Import):
                offences += [
                    f"{where}: import {alias.name}"
                    for alias in node.names
                    if alias.name.split(".")[0] == "mcp" and any(p.startswith("_") for p in alias.name.split("."))
                ]
    assert not offences, "private SDK names outside taskhub/mcp/sdk_private.py:\n" + "\n".join(offences)
