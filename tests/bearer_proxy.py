"""A small HTTP proxy that adds `Authorization: Bearer <token>` to every request it forwards: the conformance suite
sends no credentials, and the gateway answers nobody without them.

`python tests/bearer_proxy.py <upstream base URL> <token file>` prints "listening on http://127.0.0.1:<port>" and
forwards every request to the same path at the upstream; tests use `BearerProxy` the same way in a thread."""

from __future__ import annotations

import asyncio
import sys
import threading

import aiohttp
from aiohttp import web

# What the proxy never forwards (hop-by-hop, or recomputed by aiohttp).
SESSION = web.AppKey("session", aiohttp.ClientSession)
DROPPED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "authorization"}


def proxy_app(upstream: str, token: str) -> web.Application:
    async def forward(request: web.Request) -> web.Response:
        headers = {key: value for key, value in request.headers.items() if key.lower() not in DROPPED_HEADERS}
        headers["Authorization"] = f"Bearer {token}"
        session = request.app[SESSION]
        async with session.request(
            request.method, upstream + request.path_qs, headers=headers, data=await request.read()
        ) as answer:
            body = await answer.read()
            kept = {key: value for key, value in answer.headers.items() if key.lower() not in DROPPED_HEADERS}
            return web.Response(status=answer.status, body=body, headers=kept)

    async def open_session(app: web.Application):
        app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        yield
        await app[SESSION].close()

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.cleanup_ctx.append(open_session)
    app.router.add_route("*", "/{path:.*}", forward)
    return app


class BearerProxy:
    """The proxy on a free port, on a thread of its own, for the length of a `with` block."""

    def __init__(self, upstream: str, token: str) -> None:
        self.upstream, self.token = upstream.rstrip("/"), token
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        runner = web.AppRunner(proxy_app(self.upstream, self.token), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> BearerProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


if __name__ == "__main__":
    upstream_url, token_file = sys.argv[1], sys.argv[2]
    with BearerProxy(upstream_url, open(token_file).read().strip()) as proxy:
        print(f"listening on {proxy.url}", flush=True)
        threading.Event().wait()
