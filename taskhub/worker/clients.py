"""Connected `TasksClient`s kept by one worker for its delivery jobs: one per HTTP server target and timeout.

A new client per job paid its SDK client, its HTTP client and a `server/discover` round trip before sending the
answer: 12-45 ms of the 90-140 ms from an approver's click to the server's `tasks/update` (bench/approval.py),
against 3 ms for a connected client. A `TasksClient` may serve concurrent requests (the SDK matches answers to
requests by id; the client connects once, under its own lock) and, after a transport failure, connects again on
its next call, so jobs share one. The key is the whole target, credentials included: a server whose token or
headers changed gets a new client. stdio targets are never kept here (each client is a server process of its own):
in a worker, a stdio server's one process is in worker/stdio/, and jobs pass its client as `owned`.

Outside a worker (`shared_clients` not entered on the running loop) every job gets a client of its own, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from taskhub.mcp.client import HttpTarget, ServerTarget, TasksClient
from taskhub.mcp.errors import ProtocolError

# A client nobody used for this long is closed (by the next job that asks for any client).
IDLE_SECONDS = 60.0


def target_key(target: HttpTarget) -> tuple:
    return (target.url, tuple(sorted(target.all_headers().items())))


@dataclass(eq=False)
class _Kept:
    client: TasksClient
    key: tuple
    users: int = 0
    last_used: float = 0.0
    dropped: bool = False


@dataclass(eq=False)
class JobClient:
    """The client a job talks through; `request` sends on a fresh connection once if a reused one is refused."""

    client: TasksClient
    reused: bool
    _pool: ClientPool | None = field(default=None, repr=False)
    _kept: _Kept | None = field(default=None, repr=False)

    async def request[R](self, send: Callable[[TasksClient], Awaitable[R]]) -> R:
        try:
            return await send(self.client)
        except ProtocolError:
            if not self.reused:
                raise
        # A kept connection's session may be one the server no longer knows (it restarted): such a server refuses
        # every request on it. A refusal applied nothing, so sending once more on a new connection is safe.
        if self._pool is not None and self._kept is not None:
            self._pool.drop(self._kept)
        async with TasksClient(self.client.target, timeout=self.client.timeout) as fresh:
            return await send(fresh)


class ClientPool:
    def __init__(self) -> None:
        self._kept: dict[tuple, _Kept] = {}
        self._closing: set[asyncio.Task] = set()

    @contextlib.asynccontextmanager
    async def client(self, target: HttpTarget, *, timeout: float) -> AsyncIterator[JobClient]:
        now = asyncio.get_running_loop().time()
        self._close_idle(now)
        key = (target_key(target), timeout)
        kept = self._kept.get(key)
        reused = kept is not None
        if kept is None:
            kept = self._kept[key] = _Kept(client=TasksClient(target, timeout=timeout), key=key)
        kept.users += 1
        try:
            yield JobClient(client=kept.client, reused=reused, _pool=self, _kept=kept)
        finally:
            kept.users -= 1
            kept.last_used = asyncio.get_running_loop().time()
            if kept.dropped and kept.users == 0:
                self._close_later(kept.client)

    def drop(self, kept: _Kept) -> None:
        """Stop handing out this client; it is closed when its last user is done."""
        if self._kept.get(kept.key) is kept:
            del self._kept[kept.key]
        kept.dropped = True

    def _close_idle(self, now: float) -> None:
        for kept in [kept for kept in self._kept.values() if kept.users == 0 and now - kept.last_used > IDLE_SECONDS]:
            self.drop(kept)
            self._close_later(kept.client)

    def _close_later(self, client: TasksClient) -> None:
        closing = asyncio.create_task(client.aclose(), name="close kept mcp client")
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        kept, self._kept = list(self._kept.values()), {}
        await asyncio.gather(*(item.client.aclose() for item in kept), *self._closing, return_exceptions=True)


_pools: dict[asyncio.AbstractEventLoop, ClientPool] = {}


@contextlib.asynccontextmanager
async def shared_clients() -> AsyncIterator[ClientPool]:
    """Jobs on this loop share connected clients until the block ends (the worker's lifetime); then all close."""
    loop = asyncio.get_running_loop()
    pool = _pools[loop] = ClientPool()
    try:
        yield pool
    finally:
        if _pools.get(loop) is pool:
            del _pools[loop]
        await pool.aclose()


@contextlib.asynccontextmanager
async def job_client(
    target: ServerTarget, *, timeout: float, owned: TasksClient | None = None
) -> AsyncIterator[JobClient]:
    """A kept client in a worker (HTTP targets), else a client of the job's own, closed when the job is done.
    `owned`: the client of a stdio server's process that this worker runs (worker/stdio/), used and left open;
    never retried on a fresh connection, which would be a process that knows none of the server's tasks."""
    if owned is not None:
        yield JobClient(client=owned, reused=False)
        return
    pool = _pools.get(asyncio.get_running_loop())
    if pool is not None and isinstance(target, HttpTarget):
        async with pool.client(target, timeout=timeout) as kept:
            yield kept
        return
    async with TasksClient(target, timeout=timeout) as client:
        yield JobClient(client=client, reused=False)
