"""A recording HTTP proxy for tests: what a client really sends, and what the server really answers.

It sits between a client and an MCP server over real loopback HTTP, forwards every request
unchanged, streams every response back unchanged (SSE included), and keeps each exchange:
request headers and JSON body, response status and the JSON-RPC messages of the body.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.threaded_app import ThreadedApp

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.monotonic)
    status: int | None = None
    messages: list[Any] = field(default_factory=list)
    """JSON-RPC messages in the response: one for a JSON body, one per SSE `data:` event."""


class WireRecorder:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = f"{parts.scheme}://{parts.netloc}"  # paths are forwarded as the client sends them
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def requests(self, method: str | None = None) -> list[Exchange]:
        with self._lock:
            found = [e for e in self.exchanges if isinstance(e.body, dict) and "method" in e.body]
        return [e for e in found if method is None or e.body["method"] == method]

    def start(self):
        self._served = ThreadedApp(
            Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "DELETE"])])
        )
        self.port = self._served.start()
        return self

    def stop(self) -> None:
        self._served.stop()

    async def _forward(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        exchange = Exchange(request.method, request.url.path, dict(request.headers), body)
        with self._lock:
            self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        client = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=None))
        upstream = client.build_request(request.method, self.upstream + request.url.path, headers=headers, content=raw)
        try:
            response = await client.send(upstream, stream=True)
        except httpx2.TransportError:
            await client.aclose()
            exchange.status = 502
            return Response(status_code=502)
        exchange.status = response.status_code
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")

        async def relay():
            buffer = b""
            try:
                async for chunk in response.aiter_raw():
                    buffer += chunk
                    if is_sse:
                        buffer = self._take_sse_events(buffer, exchange)
                    yield chunk
            except (httpx2.TransportError, asyncio.CancelledError):
                pass
            finally:
                if not is_sse and buffer:
                    try:
                        exchange.messages.append(json.loads(buffer))
                    except ValueError:
                        exchange.messages.append(buffer.decode(errors="replace"))
                await response.aclose()
                await client.aclose()

        passthrough = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_BY_HOP}
        return StreamingResponse(relay(), status_code=response.status_code, headers=passthrough)

    @staticmethod
    def _take_sse_events(buffer: bytes, exchange: Exchange) -> bytes:
        normalized = buffer.replace(b"\r\n", b"\n")
        *events, rest = normalized.split(b"\n\n")
        for event in events:
            data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
            if data:
                try:
                    exchange.messages.append(json.loads(data))
                except ValueError:
                    exchange.messages.append(data.decode(errors="replace"))
        return rest
