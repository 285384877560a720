"""Assembling and running the demo MCP server (Streamable HTTP via uvicorn, or stdio)."""

from __future__ import annotations

import hmac
import logging
import socket
import sys
from dataclasses import dataclass
from typing import Any

import anyio
import uvicorn
from mcp.server import MCPServer
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from taskhub.demo.engine import TaskEngine
from taskhub.demo.extension import TasksExtension
from taskhub.demo.listen import TaskListenMiddleware
from taskhub.demo.stats import DemoStats
from taskhub.demo.store import TaskStore
from taskhub.demo.tools import conformance_tools, contract_tools, hostile_tools

logger = logging.getLogger(__name__)

INSTRUCTIONS = (
    "taskhub demo server: long-running tools that become tasks (MCP Tasks extension), with approvals, "
    "failures and cancellation."
)


@dataclass(frozen=True)
class DemoConfig:
    transport: str  # "http" or "stdio"
    host: str = "127.0.0.1"
    port: int = 8765
    state: str | None = None
    poll_interval_ms: int = 1000
    ttl_ms: int | None = 86_400_000
    conformance: bool = False
    hostile: bool = False
    require_token: str | None = None
    get_delay_ms: int = 0
    update_delay_ms: int = 0
    list_delay_ms: int = 0


@dataclass
class DemoServer:
    mcp: MCPServer
    engine: TaskEngine
    store: TaskStore
    stats: DemoStats


def build_server(config: DemoConfig) -> DemoServer:
    store = TaskStore(config.state or ":memory:")
    engine = TaskEngine(store, poll_interval_ms=config.poll_interval_ms, ttl_ms=config.ttl_ms)
    stats = DemoStats()
    plain_tools, task_tools = contract_tools()
    if config.conformance:
        extra_plain, extra_tasks = conformance_tools()
        plain_tools, task_tools = plain_tools + extra_plain, task_tools + extra_tasks
    if config.hostile:
        extra_plain, extra_tasks = hostile_tools()
        plain_tools, task_tools = plain_tools + extra_plain, task_tools + extra_tasks
    mcp = MCPServer(
        "taskhub-demo",
        version="0.1.0",
        instructions=INSTRUCTIONS,
        tools=plain_tools + [task_tool.tool for task_tool in task_tools],
        extensions=[
            TasksExtension(
                engine, task_tools, stats, get_delay_ms=config.get_delay_ms, update_delay_ms=config.update_delay_ms
            )
        ],
        middleware=[TaskListenMiddleware(engine), ToolsListDelay(config.list_delay_ms)],
        log_level="WARNING",
    )

    @mcp.custom_route("/demo/stats", methods=["GET"])
    async def demo_stats(request: Request) -> Response:
        return JSONResponse(stats.snapshot())

    return DemoServer(mcp, engine, store, stats)


class ToolsListDelay:
    """Holds each tools/list (a slow server: discovery takes this long at least)."""

    def __init__(self, delay_ms: int) -> None:
        self._delay = delay_ms / 1000

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "tools/list" and self._delay:
            await anyio.sleep(self._delay)
        return await call_next(ctx)


class BearerTokenGate:
    """Answers 401 to any HTTP request without `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                response = JSONResponse(
                    {"error": "unauthorized"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)


async def serve(config: DemoConfig) -> None:
    demo = build_server(config)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(demo.engine.run_ticker)
            if config.transport == "http":
                await _serve_http(demo, config)
            else:
                await demo.mcp.run_stdio_async()
            tasks.cancel_scope.cancel()
    finally:
        demo.store.close()


def tcp_socket(family: int = socket.AF_INET) -> socket.socket:
    """A socket for uvicorn to serve on, whose connections send each answer at once.

    asyncio turns Nagle's algorithm off only on sockets whose protocol says TCP (`base_events._set_nodelay`);
    `socket.socket(family, SOCK_STREAM)` says 0, and so do the connections it accepts. uvicorn writes an answer's
    head and body in two sends, and with Nagle on the body waits for the client's ACK of the head: 40 ms of
    delayed ACK on Linux whenever requests come often (measured: every `tasks/get` 44 ms instead of 2 ms, polled
    every 33 ms on one kept connection)."""
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)


async def _serve_http(demo: DemoServer, config: DemoConfig) -> None:
    app: ASGIApp = demo.mcp.streamable_http_app(host=config.host)
    if config.require_token:
        app = BearerTokenGate(app, config.require_token)
    # Bind first so `--port 0` has a real port to announce once uvicorn is ready.
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = tcp_socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_announce_when_started, server, config.host, port)
        await server.serve(sockets=[sock])
        tasks.cancel_scope.cancel()


async def _announce_when_started(server: uvicorn.Server, host: str, port: int) -> None:
    while not server.started:
        await anyio.sleep(0.02)
    shown_host = f"[{host}]" if ":" in host else host
    sys.stdout.write(f"taskhub-demo listening on http://{shown_host}:{port}/mcp\n")
    sys.stdout.flush()
