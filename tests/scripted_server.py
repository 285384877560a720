"""A bare JSON-RPC-over-HTTP MCP peer for tests, whose answers to each method are scripted.

Real enough for the SDK client (it answers `server/discover` and `tools/list` properly over real
loopback HTTP), and free to answer anything else however a sloppy or hostile server would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.threaded_app import ThreadedApp

EXTENSION_ID = "io.modelcontextprotocol/tasks"

DISCOVER_RESULT = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}, "extensions": {EXTENSION_ID: {}}},
    "ttlMs": 0,
    "cacheScope": "private",
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "scripted", "version": "1"}},
}
TOOLS_RESULT = {
    "resultType": "complete",
    "tools": [{"name": "work", "inputSchema": {"type": "object"}}],
    "ttlMs": 0,
    "cacheScope": "private",
}

Answer = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
"""A JSON-RPC `result` (or `{"error": …}`) for a method, or a function of the request params giving one."""


class ScriptedServer:
    def __init__(self, answers: dict[str, Answer]) -> None:
        self.answers = {"server/discover": DISCOVER_RESULT, "tools/list": TOOLS_RESULT, **answers}
        self.received: list[dict[str, Any]] = []
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self):
        self._served = ThreadedApp(Starlette(routes=[Route("/mcp", self._handle, methods=["POST"])]))
        self.port = self._served.start()
        return self

    def stop(self) -> None:
        self._served.stop()

    async def _handle(self, request: Request) -> Response:
        message = json.loads(await request.body())
        self.received.append(message)
        if "id" not in message:
            return Response(status_code=202)
        answer = self.answers.get(message["method"])
        if answer is None:
            body = {"code": -32601, "message": "Method not found"}
            return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": body})
        if callable(answer):
            answer = answer(message.get("params") or {})
        if "error" in answer and len(answer) == 1:
            return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": answer["error"]})
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": answer})
