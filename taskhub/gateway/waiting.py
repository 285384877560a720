"""What a gateway stream or wait holds while nothing happens: no thread, no database connection, and a slot.

Wake-ups: a `subscriptions/listen` stream and a waiting `tools/call` join the channel-layer groups of their tasks
(`task.<id>`, what the live pages hear: tasks/signals.py → live/publish.py) through the process's hub (live/hub.py),
so a change committed in any process (a worker, another daphne) wakes them through the layer (Redis in production,
in memory in the one-command demo). Only then do they read Postgres, in a short call on the gateway's own small
thread pool (`on_gateway_thread`): however many streams are open, they share its few connections. Channel messages
are at-most-once, so a stream also re-reads every SAFETY_NET_SECONDS (a waiting call sooner at first: it is short).

Slots: open streams and waiting calls are counted per API token and in total, per process
(TASKHUB_GATEWAY_STREAMS_PER_TOKEN, TASKHUB_GATEWAY_STREAMS_TOTAL); past either the request is refused with a
JSON-RPC error naming the setting, before anything is read or written.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from channels.db import DatabaseSyncToAsync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, connections

from taskhub.gateway.protocol import RpcError
from taskhub.live import publish
from taskhub.live.groups import ACCESS_GROUP, CATALOGUE_GROUP, task_group, user_group
from taskhub.live.hub import hub_for

# At-most-once messages: a stream re-reads its tasks (and tool list) this often even when nothing woke it.
SAFETY_NET_SECONDS = 30.0
# A waiting tools/call (60 s at most) looks first after this, then twice as long each time, up to SAFETY_NET_SECONDS.
WAIT_SAFETY_NET_FIRST_SECONDS = 1.0
# The threads (each with its database connection) on which every stream and wait of a process reads when woken.
GATEWAY_THREADS = 4
# Implementation-defined JSON-RPC code (-32000..-32019): too many open streams and waiting calls.
TOO_MANY_OPEN = -32002

_executor = ThreadPoolExecutor(max_workers=GATEWAY_THREADS, thread_name_prefix="taskhub-gateway")


def on_gateway_thread(function):
    """`database_sync_to_async(function)` on the gateway's pool: connections checked before and after each call
    (close_old_connections), at most GATEWAY_THREADS of them for every stream and wait of the process."""
    return DatabaseSyncToAsync(function, thread_sensitive=False, executor=_executor)


def close_gateway_connections(timeout: float = 10) -> None:
    """Close every pool thread's connection (tests: an open one keeps the test database from being dropped)."""
    barrier = threading.Barrier(GATEWAY_THREADS)

    def close_this_threads() -> None:
        connections.close_all()
        barrier.wait(timeout)

    for future in [_executor.submit(close_this_threads) for _ in range(GATEWAY_THREADS)]:
        future.result(timeout + 1)


def release_request_connection() -> None:
    """Close the request thread's connection before a long wait (it reconnects if the request reads again). Not
    inside a transaction: a test's, which the request shares."""
    if not connection.in_atomic_block:
        connection.close()


# --- slots --------------------------------------------------------------------------------------------------

_open_per_token: Counter[int] = Counter()
_open_lock = threading.Lock()


class Slot:
    """One open stream or waiting call of a token; `release()` is idempotent."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id
        self.released = False

    def release(self) -> None:
        with _open_lock:
            if self.released:
                return
            self.released = True
            _open_per_token[self.token_id] -= 1
            if _open_per_token[self.token_id] <= 0:
                del _open_per_token[self.token_id]

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take_slot(token_id: int) -> Slot:
    """A slot for one more stream or wait of this token, or RpcError naming the cap it would pass."""
    per_token = settings.TASKHUB_GATEWAY_STREAMS_PER_TOKEN
    total = settings.TASKHUB_GATEWAY_STREAMS_TOTAL
    with _open_lock:
        if _open_per_token[token_id] >= per_token:
            raise _too_many(f"this token already has {per_token}", "TASKHUB_GATEWAY_STREAMS_PER_TOKEN", per_token)
        if sum(_open_per_token.values()) >= total:
            raise _too_many(f"the gateway already has {total}", "TASKHUB_GATEWAY_STREAMS_TOTAL", total)
        _open_per_token[token_id] += 1
    return Slot(token_id)


def open_slots() -> int:
    with _open_lock:
        return sum(_open_per_token.values())


def _too_many(who: str, setting: str, limit: int) -> RpcError:
    return RpcError(
        TOO_MANY_OPEN,
        f"Too many open subscriptions/listen streams and waiting tools/call requests: {who} ({setting}). "
        "Close one, or retry later.",
        {"cap": setting, "limit": limit},
        http_status=429,
    )


# --- wake-ups -------------------------------------------------------------------------------------------------


class Wakeups:
    """The channel-layer messages about some tasks (and, with `tools_of_user`, that user's access and the servers'
    tools: their tool list may have changed). Join before reading the state they wake a re-read of, so no change
    falls in between."""

    def __init__(self, task_ids, *, tools_of_user: int | None = None) -> None:
        self.groups = [task_group(task_id) for task_id in task_ids]
        if tools_of_user is not None:
            self.groups += [ACCESS_GROUP, CATALOGUE_GROUP, user_group(tools_of_user)]
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.layer = get_channel_layer()
        self.hub = None

    async def __aenter__(self) -> Wakeups:
        if self.layer is not None:
            # The in-memory layer's queues belong to this loop: a publish from another thread is handed to it.
            publish.remember_consumer_loop(asyncio.get_running_loop())
            self.hub = hub_for(self.layer)
            for group in self.groups:
                await self.hub.join(group, self.inbox)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.hub is not None:
            for group in self.groups:
                await self.hub.leave(group, self.inbox)

    async def wait(self, timeout: float) -> list[dict]:
        """The messages that came within `timeout` seconds (all that queued up once one came), or []."""
        try:
            first = await asyncio.wait_for(self.inbox.get(), max(timeout, 0))
        except TimeoutError:
            return []
        messages = [first]
        while not self.inbox.empty():
            messages.append(self.inbox.get_nowait())
        return messages
