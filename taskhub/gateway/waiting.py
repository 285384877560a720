"""What a gateway stream or wait holds while nothing happens: no thread, no database connection, and a slot.

Wake-ups: a `subscriptions/listen` stream and a waiting `tools/call` join the channel-layer groups of their tasks
(`task.<id>`, what the live pages hear: tasks/signals.py → live/publish.py) through the process's hub (live/hub.py),
so a change committed in any process (a worker, another daphne) wakes them through the layer (Redis in production,
in memory in the one-command demo). Only then do they read Postgres, in a short call on the gateway's own small
thread pool (`on_gateway_thread`): however many streams are open, they share its few connections, and the streams
woken by one change read the changed task once between them (`read_once`, keyed by the change's message).
Channel messages are at-most-once, so the process has one safety net for all its streams (`SafetyNet`): every
SAFETY_NET_SECONDS one query asks which of the tasks listened to changed since its last look, and wakes only their
streams (and the tool-list listeners every TOOLS_SAFETY_NET_ROUNDS looks); a waiting call also looks on its own, sooner
at first, since it is short. 500 idle streams cost one query per SAFETY_NET_SECONDS, not 500 (bench/gateway.py
--listen).

Slots: open streams and waiting calls are counted per API token and in total, per process
(TASKHUB_GATEWAY_STREAMS_PER_TOKEN, TASKHUB_GATEWAY_STREAMS_TOTAL); past either the request is refused with a
JSON-RPC error naming the setting, before anything is read or written.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
import weakref
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from channels.db import DatabaseSyncToAsync
from channels.layers import get_channel_layer
from django.conf import settings

from taskhub.gateway.protocol import RpcError
from taskhub.live import publish
from taskhub.live.groups import ACCESS_GROUP, CATALOGUE_GROUP, task_group, user_group
from taskhub.live.hub import hub_for
from taskhub.live.threads import close_pool_connections
from taskhub.tasks.models import Task
from taskhub.web.request_threads import SERVED_WITHOUT_A_KEPT_THREAD

# At-most-once messages: the process looks this often for changes of listened tasks that woke no stream.
SAFETY_NET_SECONDS = 30.0
# ... and wakes the tool-list listeners every this many looks (5 minutes): their changes are rare, and each is
# published too (a server's catalogue, anyone's access).
TOOLS_SAFETY_NET_ROUNDS = 10
# The message the safety net sends a tool-list listener (any type but TASK_CHANGED makes a stream read its tools).
SAFETY_NET_TOOLS = "gateway.safety_net.tools"
# How long the read of one change stays shared with streams that wake late.
SHARED_READ_SECONDS = 2.0
# The safety net looks at changes from this long before its previous look (clocks of processes and Postgres differ).
SAFETY_NET_OVERLAP = 5.0
# A waiting tools/call (60 s at most) looks first after this, then twice as long each time, up to SAFETY_NET_SECONDS.
WAIT_SAFETY_NET_FIRST_SECONDS = 1.0
# The threads (each with its database connection) on which every stream and wait of a process reads when woken.
GATEWAY_THREADS = 4
# How many gateway requests of a process run their sync part (the token check, a call's reads and writes) at once
# (in_turn), each on a thread with a database connection of its own; the others wait their turn without a thread. A
# burst of 180 requests at once (one token's streams past its cap) otherwise opened a connection each: Postgres's 100
# ran out under CI ("too many clients"). Measured in tests/test_gateway_stack.py's burst, the test database's peak of
# connections: 94 without turns, 73 with 16, 40 with 8, 34 with 4.
REQUEST_TURNS = 8
# Implementation-defined JSON-RPC code (-32000..-32019): too many open streams and waiting calls.
TOO_MANY_OPEN = -32002

logger = logging.getLogger(__name__)

_executor = ThreadPoolExecutor(max_workers=GATEWAY_THREADS, thread_name_prefix="taskhub-gateway")


def on_gateway_thread(function):
    """`database_sync_to_async(function)` on the gateway's pool: connections checked before and after each call
    (close_old_connections), at most GATEWAY_THREADS of them for every stream and wait of the process."""
    return DatabaseSyncToAsync(function, thread_sensitive=False, executor=_executor)


def close_gateway_connections(timeout: float = 10) -> None:
    """Close every pool thread's connection (tests: an open one keeps the test database from being dropped)."""
    close_pool_connections(_executor, GATEWAY_THREADS, timeout=timeout)


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


async def in_turn(function, *args):
    """`function(*args)`, a gateway request's sync part, in one of the process's REQUEST_TURNS turns (per event loop:
    daphne runs one; tests' clients a new one per request): on the request's thread (sync_to_async) when it is a kept
    one (a method answered at once, a listen's request) or the caller's (Django's test client), else on the gateway's
    pool, whose threads keep their connections. A `tools/call`'s own thread is new for each request (it may wait for
    a minute: taskhub.web.request_threads), and its new connection was half of the time the gateway took to record
    the launch (bench/gateway.py: 18-20 ms before, 8-9 after)."""
    loop = asyncio.get_running_loop()
    turns = _turns.get(loop)
    if turns is None:
        turns = _turns[loop] = asyncio.Semaphore(REQUEST_TURNS)
    async with turns:
        if SERVED_WITHOUT_A_KEPT_THREAD.get():
            return await on_gateway_thread(function)(*args)
        return await sync_to_async(function)(*args)


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

    def __init__(self, task_ids, *, tools_of_user: int | None = None, access_of_user: int | None = None) -> None:
        """`access_of_user`: also woken when that user's access may have changed (their token revoked, deactivated,
        a role taken), so that their stream can end."""
        self.task_ids = frozenset(str(task_id) for task_id in task_ids)
        self.tools = tools_of_user is not None
        self.groups = [task_group(task_id) for task_id in task_ids]
        if tools_of_user is not None:
            self.groups += [CATALOGUE_GROUP]
        for user_id in dict.fromkeys(u for u in (tools_of_user, access_of_user) if u is not None):
            self.groups += [ACCESS_GROUP, user_group(user_id)]
        self.groups = list(dict.fromkeys(self.groups))
        self.inbox = Mailbox()
        self.layer = get_channel_layer()
        self.hub = None

    async def __aenter__(self) -> Wakeups:
        SafetyNet.of_this_loop().watch(self)
        if self.layer is not None:
            # The in-memory layer's queues belong to this loop: a publish from another thread is handed to it.
            publish.remember_consumer_loop(asyncio.get_running_loop())
            self.hub = hub_for(self.layer)
            for group in self.groups:
                await self.hub.join(group, self.inbox)
        return self

    async def __aexit__(self, *exc) -> None:
        SafetyNet.of_this_loop().forget(self)
        if self.hub is not None:
            for group in self.groups:
                await self.hub.leave(group, self.inbox)

    async def wait(self, timeout: float) -> list[dict]:
        """The messages that came within `timeout` seconds (all that queued up once one came), or []."""
        return await self.inbox.wait(timeout)


class Mailbox:
    """Where the hub and the safety net put a stream's or a wait's messages (their `put_nowait`, on the loop): a list,
    and a future only while someone waits. An asyncio.Queue is four deques, 3 KB of each idle stream."""

    __slots__ = ("messages", "waiter")

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.waiter: asyncio.Future | None = None

    def put_nowait(self, message: dict) -> None:
        self.messages.append(message)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout: float) -> list[dict]:
        """Every message put since the last wait, once there is one, or [] after `timeout` seconds."""
        if not self.messages:
            loop = asyncio.get_running_loop()
            self.waiter = loop.create_future()
            timer = loop.call_later(max(timeout, 0), _settle, self.waiter)
            try:
                await self.waiter
            finally:
                timer.cancel()
                self.waiter = None
        messages, self.messages = self.messages, []
        return messages


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


# --- one safety net and one read per change, for every stream of the process ----------------------------------


class SafetyNet:
    """Per event loop: one look every SAFETY_NET_SECONDS at which listened tasks changed since the last look (one
    query for all the loop's streams and waits), each change handed to the inboxes of the streams that listen to it
    as the layer would have. Runs while anything listens."""

    @classmethod
    def of_this_loop(cls) -> SafetyNet:
        loop = asyncio.get_running_loop()
        net = _safety_nets.get(loop)
        if net is None:
            net = _safety_nets[loop] = cls()
        return net

    def __init__(self) -> None:
        self.watched: set[Wakeups] = set()
        self.looking: asyncio.Task | None = None
        self.rounds = 0

    def watch(self, wakeups: Wakeups) -> None:
        self.watched.add(wakeups)
        if self.looking is None or self.looking.done():
            self.looking = asyncio.get_running_loop().create_task(self._look_while_watched())

    def forget(self, wakeups: Wakeups) -> None:
        self.watched.discard(wakeups)

    async def _look_while_watched(self) -> None:
        since = time.time()
        while self.watched:
            await asyncio.sleep(SAFETY_NET_SECONDS)
            looked_at = time.time()
            task_ids = set().union(*(wakeups.task_ids for wakeups in self.watched)) if self.watched else set()
            try:
                changed = await on_gateway_thread(_changed_since)(task_ids, since - SAFETY_NET_OVERLAP)
            except Exception:  # the next look tries again from the same moment
                logger.warning("the gateway's safety net could not look for changes", exc_info=True)
                continue
            since = looked_at
            self.rounds += 1
            tools_due = self.rounds % TOOLS_SAFETY_NET_ROUNDS == 0
            for wakeups in list(self.watched):
                for task_id in wakeups.task_ids & changed:
                    message_id = f"safety-net-{task_id}-{looked_at}"
                    wakeups.inbox.put_nowait(
                        {"type": publish.TASK_CHANGED, "task_id": task_id, "message_id": message_id}
                    )
                if tools_due and wakeups.tools:
                    wakeups.inbox.put_nowait({"type": SAFETY_NET_TOOLS})


_safety_nets: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SafetyNet] = weakref.WeakKeyDictionary()


def _changed_since(task_ids: set[str], since: float) -> set[str]:
    if not task_ids:
        return set()
    moment = datetime.datetime.fromtimestamp(since, tz=datetime.UTC)
    return {str(pk) for pk in Task.objects.filter(pk__in=task_ids, updated_at__gte=moment).values_list("pk", flat=True)}


_shared_reads: dict[tuple, asyncio.Future] = {}


async def read_once(key: tuple, read):
    """`await read()`, shared by every caller with the same `key` (a task and the message of its change) within
    SHARED_READ_SECONDS: ten streams woken by one change read the task once. A read begins after the change it is
    keyed by was committed, so sharing it shows every caller that change."""
    future = _shared_reads.get(key)
    if future is None:
        future = _shared_reads[key] = asyncio.ensure_future(read())
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda _: loop.call_later(SHARED_READ_SECONDS, _shared_reads.pop, key, None))
    return await asyncio.shield(future)
