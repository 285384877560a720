"""The tracker: follows live tasks by polling `tasks/get`, across any number of worker processes.

How it shares the work (Postgres alone coordinates):
- Each worker claims due rows of the narrow `tasks_taskpoll` table in batches (`FOR UPDATE SKIP
  LOCKED`) and writes itself in as the lease owner. A lease is sticky: after each poll the worker
  reschedules the row and keeps (extends) the lease, and a renewal statement keeps the leases of rows
  it holds between polls. A worker that dies stops renewing; once its leases expire another worker's
  claim takes the rows over. On stop the worker finishes its in-flight polls and releases its leases
  (`lease_owner = ''`, the column is not nullable), so another worker can take them at once.
- A claim moves the row's `next_poll_at` one lease ahead, so no claim (ours included) picks up a
  row while it is being polled; the reschedule then sets the real time. If somebody moved
  `next_poll_at` earlier in the meantime (a job that wants a task polled at once), the earlier
  time wins.

The hot path is a few statements for many polls: a claim takes a batch of rows in one UPDATE …
RETURNING (joined with the task for what a poll needs), and reschedules are written in batches by
one UPDATE … FROM unnest(…) every few milliseconds. Both run on a psycopg `AsyncConnection` of the
tracker's own. Claimed rows wait in a due-time heap per server, taken in turn by a fixed pool of
pollers per server (no asyncio task, timer or callback per poll); each server's requests in flight
stay within its own limit, so one slow server does not hold up the others' polls. A snapshot goes
through `services.apply_snapshot` (the Django ORM, in a small thread pool) only when it differs from
the last one this worker stored for the task: the comparison is a digest of the snapshot without
`lastUpdatedAt` (some peers bump it on every read), kept in memory and forgotten when the task
changes hands. So an unchanged poll costs its share of one reschedule.

Failures:
- The server cannot be reached (transport error, timeout, HTTP 401/403): the task is not failed; its
  `consecutive_failures` grows and the next poll backs off exponentially (capped). The server's
  health says "unreachable since …" (`record_server_failure`, once per outage per worker) until it
  answers again (`record_server_success`).
- `tasks/get` says the task is unknown (-32602): past `createdAt + ttlMs` the task is expired
  (`services.expire`). Before that it is recorded on the task's timeline as a protocol error and
  polled again with backoff, since a restarting server may answer again; after
  NOT_FOUND_GIVE_UP such answers in a row the tracker gives up and expires the task (the local
  status for "the server can no longer say anything"), so a vanished task is not polled forever.
- Any other bad answer (InvalidResult, a JSON-RPC error, an answer about another task, a body that
  broke off or trickled past the timeout) is recorded on the timeline (the same problem once, not
  on every poll) and backed off; nothing a server sends can crash the tracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import psycopg
from django import db
from django.db import transaction
from pydantic_core import PydanticSerializationError

from taskhub.mcp.client import TasksClient
from taskhub.mcp.errors import (
    AuthorizationFailed,
    IncompleteAnswer,
    InvalidResult,
    McpClientError,
    MethodNotFound,
    MissingCapability,
    ProtocolError,
    RequestTimeout,
    TaskNotFound,
    TransportError,
)
from taskhub.mcp.lean import TaskGetter, task_getter
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers import services as server_services
from taskhub.servers.models import Server
from taskhub.tasks import services
from taskhub.tasks.models import LIVE_STATUSES, Task, TaskStatus

logger = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_MS = 1000
MIN_POLL_INTERVAL_MS = 250
MAX_POLL_INTERVAL_MS = 60_000
JITTER_FRACTION = 0.05
MAX_JITTER_MS = 500
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 30.0
NOT_FOUND_GIVE_UP = 5
IDLE_CLAIM_SECONDS = 0.1
# A claim takes the rows due within this much from now; each is polled at its time. So one claim per
# tick serves every task due before the next one, and no poll waits for a claim (< the interval floor).
CLAIM_AHEAD_SECONDS = 0.25
# Reschedules are written together, this often at most; each row's time counts from its answer, not the write.
FLUSH_COALESCE_SECONDS = 0.05
SERVER_REFRESH_SECONDS = 60.0
# With a live subscription, polling is only a safety net: this often at least, or 10x the task's interval.
SAFETY_NET_MS = 30_000
SUBSCRIBE_COALESCE_SECONDS = 0.2
PROBLEM_TEXT_MAX_CHARS = 500
# Log the tracker's counters (polls, statements, ...) this often, in seconds; 0 (the default) never.
# bench/tracker.py reads them to report database statements per poll.
STATS_LOG_SECONDS = float(os.environ.get("TASKHUB_TRACKER_STATS_SECONDS") or 0)
# Jitter from a generator of its own: the global one belongs to whoever else runs in the process (e.g. tests).
_jitter = random.Random()

# A row is due when its time has come and nobody else holds a live lease on it; the rows this
# worker holds are claimed again by the same statement when they fall due. Rows of a disabled server
# are left where they are (their time passed, so they are claimed at once when it is enabled again).
CLAIM_SQL = """
UPDATE tasks_taskpoll AS poll
SET lease_owner = %(owner)s,
    lease_expires_at = now() + %(lease)s,
    next_poll_at = now() + %(lease)s
FROM (
    SELECT task_id, lease_owner AS previous_owner, next_poll_at AS due_at
    FROM tasks_taskpoll
    WHERE next_poll_at <= now() + %(ahead)s
      AND (lease_owner = '' OR lease_owner = %(owner)s OR lease_expires_at IS NULL OR lease_expires_at < now())
      AND EXISTS (SELECT 1 FROM tasks_task AS task JOIN servers_server AS server ON server.id = task.server_id
                  WHERE task.id = tasks_taskpoll.task_id AND server.enabled)
    ORDER BY next_poll_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS due, tasks_task AS task
WHERE poll.task_id = due.task_id AND task.id = poll.task_id
RETURNING poll.task_id, due.previous_owner, poll.next_poll_at, poll.consecutive_failures,
          GREATEST(EXTRACT(EPOCH FROM due.due_at - now()), 0)::float8 AS due_in,
          task.remote_task_id, task.server_id, task.poll_interval_ms, task.ttl_ms, task.remote_created_at,
          task.status, task.status_message, task.result, task.error,
          EXISTS (SELECT 1 FROM tasks_inputrequest AS request
                  WHERE request.task_id = poll.task_id AND request.state = 'open') AS open_requests
"""

# The arrays go in binary (%b): psycopg dumps a list as text element by element in Python, ~10x the cost
# per row (a uuid and a timestamptz: ~70 us of the tracker's CPU per poll, as much as validating the answer).
RESCHEDULE_SQL = """
UPDATE tasks_taskpoll AS poll
SET next_poll_at = CASE
        WHEN poll.next_poll_at = v.claimed_next THEN now() + v.delay_ms * interval '1 millisecond'
        ELSE LEAST(poll.next_poll_at, now() + v.delay_ms * interval '1 millisecond')
    END,
    lease_expires_at = now() + %(lease)s,
    consecutive_failures = v.failures
FROM unnest(%(ids)b::uuid[], %(claimed)b::timestamptz[], %(delays)b::float8[], %(failures)b::int[])
    AS v(task_id, claimed_next, delay_ms, failures)
WHERE poll.task_id = v.task_id AND poll.lease_owner = %(owner)s
"""

RENEW_SQL = """
UPDATE tasks_taskpoll SET lease_expires_at = now() + %(lease)s
WHERE lease_owner = %(owner)s AND lease_expires_at < now() + %(lease)s / 2
"""

# A task that loses its subscription is due again within its poll interval, not at the safety-net time.
PULL_IN_SQL = """
UPDATE tasks_taskpoll AS poll
SET next_poll_at = LEAST(poll.next_poll_at, now() + COALESCE(task.poll_interval_ms, %(default_ms)s) * interval '1 ms')
FROM tasks_task AS task
WHERE task.id = poll.task_id AND poll.task_id = ANY(%(ids)b::uuid[]) AND poll.lease_owner = %(owner)s
"""

RELEASE_SQL = "UPDATE tasks_taskpoll SET lease_owner = '', lease_expires_at = NULL WHERE lease_owner = %(owner)s"


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__, per claimed row
class Claimed:
    """A row this worker just claimed, with what polling it needs."""

    task_id: uuid.UUID
    previous_owner: str
    claimed_next: datetime
    failures: int
    due_in: float  # seconds from the claim until the row's time: the poll waits for it
    remote_task_id: str
    server_id: int
    poll_interval_ms: int | None
    ttl_ms: int | None
    remote_created_at: str
    # What the task row says now, so that a first poll that brings nothing new writes nothing.
    status: str = ""
    status_message: str = ""
    result: Any = None
    error: Any = None
    open_requests: bool = True

    def stored_as(self, snapshot: TaskSnapshot) -> bool:
        """Whether storing `snapshot` would change nothing: `services.apply_snapshot` would find no field
        to change, no input request to open or supersede. Only said of a live task asking for no input."""
        if self.status not in LIVE_STATUSES or self.open_requests or snapshot.status == TaskStatus.INPUT_REQUIRED:
            return False
        stored = {
            "status": self.status,
            "status_message": self.status_message,
            "result": self.result,
            "error": self.error,
            "ttl_ms": self.ttl_ms,
            "poll_interval_ms": self.poll_interval_ms,
            "remote_created_at": self.remote_created_at,
        }
        # The very comparison apply_snapshot makes (tests/test_tracker.py checks that the two agree).
        wanted = services.snapshot_values(snapshot, Task(remote_created_at=self.remote_created_at))
        return all(stored[name] == wanted[name] for name in services.SNAPSHOT_FIELDS)

    def asks_beyond_open_requests(self, snapshot: TaskSnapshot) -> bool:
        """The server lists input requests while none is open here: answers on their way, or keys reused
        after their answer. Worth applying even when unchanged, so that a reused key is noted."""
        return snapshot.status == TaskStatus.INPUT_REQUIRED and bool(snapshot.input_requests) and not self.open_requests

    def ttl_passed(self, now: datetime) -> bool:
        if self.ttl_ms is None or not self.remote_created_at:
            return False
        try:
            created = datetime.fromisoformat(self.remote_created_at)
        except ValueError:
            return False
        if created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        return now > created + timedelta(milliseconds=self.ttl_ms)


@dataclass(slots=True)
class Reschedule:
    task_id: uuid.UUID
    claimed_next: datetime
    delay_ms: float
    failures: int
    at: float  # time.monotonic() when decided: the delay counts from then, however late the write


@dataclass
class TrackerStats:
    polls: int = 0
    changes: int = 0
    failures: int = 0
    claimed: int = 0
    notifications: int = 0
    claim_statements: int = 0
    reschedule_statements: int = 0
    own_statements: int = 0  # sent on the tracker's own connection (claims, reschedules, renewals, ...)
    orm_statements: int = 0  # sent by the services in the tracker's threads
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def statements(self) -> int:
        return self.own_statements + self.orm_statements

    def count_orm_statement(self) -> None:
        with self._lock:  # the ORM threads count concurrently
            self.orm_statements += 1

    def as_dict(self) -> dict[str, int]:
        counters = {name: value for name, value in vars(self).items() if not name.startswith("_")}
        return {**counters, "statements": self.statements}


@dataclass(slots=True)
class ServerQueue:
    """This worker's claimed rows of one server, earliest due first, and the pollers that take them in turn."""

    heap: list[tuple[float, int, Claimed]] = field(default_factory=list)  # (loop time due, tie-break, row)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pollers: list[asyncio.Task] = field(default_factory=list)


@dataclass
class ServerLink:
    """How the tracker reaches one server: its getter, its concurrency limit, whether it answers."""

    getter: TaskGetter
    semaphore: asyncio.Semaphore
    target: Any
    loaded_at: float
    reachable: bool | None = None  # unknown until this worker has tried
    retired: list[TaskGetter] = field(default_factory=list)
    watch: ServerWatch | None = None


@dataclass
class ServerWatch:
    """This worker's task subscriptions (`subscriptions/listen` with `taskIds`) on one server."""

    client: TasksClient
    owns_client: bool
    supported: bool | None = None  # None until a listen was acknowledged or refused
    wanted: dict[str, uuid.UUID] = field(default_factory=dict)  # remote task id -> task, for held live tasks
    queued: set[str] = field(default_factory=set)  # waiting for the next subscription
    asked: set[str] = field(default_factory=set)  # in a subscription that is being opened or is open
    covered: set[str] = field(default_factory=set)  # acknowledged by a live subscription
    refused: set[str] = field(default_factory=set)  # left out of an acknowledgement: polled, never asked again
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task | None = None
    subscriptions: set[asyncio.Task] = field(default_factory=set)


# --- pure helpers ------------------------------------------------------------------------------------


def poll_delay_ms(
    poll_interval_ms: int | None, *, floor_ms: int = MIN_POLL_INTERVAL_MS, cap_ms: int = MAX_POLL_INTERVAL_MS
) -> float:
    """The server's latest hint, kept within the floor and cap, plus a little jitter (never earlier)."""
    interval = min(max(poll_interval_ms or DEFAULT_POLL_INTERVAL_MS, floor_ms), cap_ms)
    return interval + _jitter.uniform(0, min(interval * JITTER_FRACTION, MAX_JITTER_MS))


def backoff_delay_ms(failures: int, *, base_seconds: float, cap_seconds: float) -> float:
    """Exponential in the number of failures in a row, capped, with jitter so a fleet does not retry in step."""
    delay = min(base_seconds * 2 ** max(failures - 1, 0), cap_seconds) * 1000
    return delay * _jitter.uniform(0.9, 1.1)


def snapshot_digest(snapshot: TaskSnapshot) -> bytes:
    """What decides whether a snapshot is news: everything but lastUpdatedAt.

    pydantic's own JSON (fields in declaration order, extra keys in the order sent): a peer that reorders
    its extra keys costs one needless apply_snapshot, which finds nothing to change."""
    try:
        encoded = snapshot.model_dump_json(by_alias=True, exclude_none=True, exclude={"last_updated_at"})
    except PydanticSerializationError:  # a lone surrogate, which JSON can carry and UTF-8 cannot
        encoded = repr(snapshot.model_dump(by_alias=True, exclude_none=True, exclude={"last_updated_at"}))
    return hashlib.blake2b(encoded.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _short(text: str) -> str:
    return text if len(text) <= PROBLEM_TEXT_MAX_CHARS else text[: PROBLEM_TEXT_MAX_CHARS - 1] + "…"


# --- the ORM side (runs in the tracker's threads) ------------------------------------------------------


def _fresh_connection(work: Callable[[], Any], used: set, stats: TrackerStats) -> Any:
    # These threads see no request cycle, so drop a connection that broke or aged before using it.
    db.close_old_connections()
    connection = db.connections["default"]
    used.add(connection)

    def counted(execute, sql, params, many, context):
        stats.count_orm_statement()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        return work()


def _load_target(server_id: int):
    return Server.objects.get(pk=server_id).to_target()


def _apply(task_id: uuid.UUID, snapshot: TaskSnapshot, asked_at: datetime | None = None, source: str = "poll") -> bool:
    return services.apply_snapshot(task=Task(pk=task_id), snapshot=snapshot, source=source, asked_at=asked_at)


def _expire(task_id: uuid.UUID) -> bool:
    return services.expire(task=Task(pk=task_id))


def _server_failed(server_id: int, error: str) -> None:
    server_services.record_server_failure(server=Server(pk=server_id), error=error)


def _server_answered(server_id: int) -> None:
    server_services.record_server_success(server=Server(pk=server_id))


def _record_poll_problem(task_id: uuid.UUID, data: dict[str, Any]) -> bool:
    """Put a bad answer on the task's timeline, once per distinct problem in a row."""
    with transaction.atomic():
        task = Task.objects.select_for_update().only("id", "server_id").get(pk=task_id)
        return services.record_protocol_error_once(task=task, data=data)


def _close_connections(wrappers: set) -> None:
    """Close the Django connections the tracker's threads opened, once those threads are done."""
    for wrapper in wrappers:
        wrapper.inc_thread_sharing()
        try:
            wrapper.close()
        finally:
            wrapper.dec_thread_sharing()


def _database_params() -> dict[str, Any]:
    params = dict(db.connections["default"].get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return params


# --- the tracker ---------------------------------------------------------------------------------------


class Tracker:
    """Follow live tasks until they end. `await tracker.run(stop)`; it returns after `stop` is set and
    its in-flight polls are finished and its leases released."""

    def __init__(
        self,
        *,
        worker_id: str,
        batch_size: int = 500,
        lease_seconds: float = 30.0,
        per_server_concurrency: int = 32,
        max_in_flight: int = 5000,
        claim_ahead_seconds: float = CLAIM_AHEAD_SECONDS,
        request_timeout: float = 10.0,
        min_interval_ms: int = MIN_POLL_INTERVAL_MS,
        max_interval_ms: int = MAX_POLL_INTERVAL_MS,
        backoff_base_seconds: float = BACKOFF_BASE_SECONDS,
        backoff_cap_seconds: float = BACKOFF_CAP_SECONDS,
        service_threads: int = 4,
        listen: bool = True,
    ) -> None:
        if not worker_id:
            raise ValueError("a tracker needs a worker_id (it is the lease owner)")
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.lease = timedelta(seconds=lease_seconds)
        self.per_server_concurrency = per_server_concurrency
        self.max_in_flight = max_in_flight
        self.claim_ahead = timedelta(seconds=claim_ahead_seconds)
        self.request_timeout = min(request_timeout, lease_seconds / 2)
        self.min_interval_ms = min_interval_ms
        self.max_interval_ms = max_interval_ms
        self.backoff_base_seconds = backoff_base_seconds
        self.backoff_cap_seconds = backoff_cap_seconds
        self.listen = listen
        self.stats = TrackerStats()
        self._service_threads = service_threads
        self._executor: ThreadPoolExecutor | None = None
        self._thread_connections: set = set()
        self._db: psycopg.AsyncConnection | None = None
        self._db_lock = asyncio.Lock()
        self._servers: dict[int, ServerLink] = {}
        self._server_lock = asyncio.Lock()
        self._digests: dict[uuid.UUID, bytes] = {}
        self._not_found: dict[uuid.UUID, int] = {}
        self._notification_problems: dict[uuid.UUID, str] = {}  # the last one recorded, per task
        self._background: set[asyncio.Task] = set()
        # Task ids claimed and not yet rescheduled (queued or being polled): never two polls of one task at once.
        self._held: set[uuid.UUID] = set()
        self._queues: dict[int, ServerQueue] = {}
        self._queue_order = itertools.count()
        self._draining = False
        self._pending: list[Reschedule] = []
        self._pending_ready = asyncio.Event()
        self._poll_finished = asyncio.Event()
        self._stopping = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._executor = ThreadPoolExecutor(self._service_threads, thread_name_prefix=f"tracker-{self.worker_id}")
        flushing = asyncio.Event()
        helpers: list[asyncio.Task] = []
        try:
            await self._connect()
            helpers = [
                asyncio.create_task(self._flush_loop(flushing), name="tracker-flush"),
                asyncio.create_task(self._renew_loop(stop), name="tracker-renew"),
            ]
            if STATS_LOG_SECONDS > 0:
                helpers.append(asyncio.create_task(self._stats_loop(stop), name="tracker-stats"))
            await self._claim_loop(stop)
        finally:
            await self._wind_down(helpers, flushing)

    async def _wind_down(self, helpers: list[asyncio.Task], flushing: asyncio.Event) -> None:
        self._stopping = True
        # The pollers poll every row still queued (due within the claim-ahead time), then end.
        self._draining = True
        for queue in self._queues.values():
            queue.ready.set()
        pollers = [poller for queue in self._queues.values() for poller in queue.pollers]
        if pollers:
            await asyncio.gather(*pollers, return_exceptions=True)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        flushing.set()
        self._pending_ready.set()
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._flush()
        try:
            await self._pull_in(self._covered_task_ids())
            await self._execute(RELEASE_SQL, {"owner": self.worker_id})
        except Exception:
            logger.exception("tracker %s could not release its leases; they expire by themselves", self.worker_id)
        for link in self._servers.values():
            if link.watch is not None:
                await self._stop_watch(link.watch)
            for getter in (link.getter, *link.retired):
                with contextlib.suppress(Exception):
                    await getter.aclose()
        self._servers.clear()
        if self._db is not None:
            with contextlib.suppress(Exception):
                await self._db.close()
        await self._close_executor()

    async def _close_executor(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        await asyncio.to_thread(executor.shutdown, wait=True)
        try:
            await asyncio.to_thread(_close_connections, self._thread_connections)
        except Exception:
            logger.exception("tracker %s: closing its database connections failed", self.worker_id)
        self._thread_connections.clear()

    # -- database (the hot path) ----------------------------------------------------------------

    async def _connect(self) -> None:
        params = await self._in_thread(_database_params)
        self._db = await psycopg.AsyncConnection.connect(autocommit=True, **params)

    async def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        async with self._db_lock:
            if self._db is None or self._db.closed or self._db.broken:
                await self._connect()
            assert self._db is not None
            self.stats.own_statements += 1
            cursor = await self._db.execute(sql, params)
            return await cursor.fetchall() if cursor.description else []

    async def _claim(self, limit: int) -> list[Claimed]:
        params = {"owner": self.worker_id, "lease": self.lease, "limit": limit, "ahead": self.claim_ahead}
        rows = await self._execute(CLAIM_SQL, params)
        self.stats.claim_statements += 1
        return [Claimed(*row) for row in rows]

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        now = time.monotonic()
        params = {
            "owner": self.worker_id,
            "lease": self.lease,
            "ids": [item.task_id for item in batch],
            "claimed": [item.claimed_next for item in batch],
            "delays": [max(item.delay_ms - (now - item.at) * 1000, 0.0) for item in batch],
            "failures": [item.failures for item in batch],
        }
        try:
            await self._execute(RESCHEDULE_SQL, params)
            self.stats.reschedule_statements += 1
        except Exception:
            self._pending = batch + self._pending
            raise

    async def _flush_loop(self, flushing: asyncio.Event) -> None:
        while not flushing.is_set():
            await self._pending_ready.wait()
            self._pending_ready.clear()
            await asyncio.sleep(FLUSH_COALESCE_SECONDS)
            try:
                await self._flush()
            except Exception:
                logger.exception("tracker %s: rescheduling failed; retrying", self.worker_id)
                await asyncio.sleep(1)
                self._pending_ready.set()

    async def _stats_loop(self, stop: asyncio.Event) -> None:
        while not await _wait(stop, STATS_LOG_SECONDS):
            logger.info("tracker %s stats %s", self.worker_id, json.dumps(self.stats.as_dict()))

    async def _renew_loop(self, stop: asyncio.Event) -> None:
        every = self.lease.total_seconds() / 3
        while not await _wait(stop, every):
            try:
                await self._execute(RENEW_SQL, {"owner": self.worker_id, "lease": self.lease})
            except Exception:
                logger.exception("tracker %s: renewing leases failed", self.worker_id)

    async def _pull_in(self, task_ids: list[uuid.UUID]) -> None:
        if task_ids:
            params = {"ids": task_ids, "owner": self.worker_id, "default_ms": DEFAULT_POLL_INTERVAL_MS}
            await self._execute(PULL_IN_SQL, params)

    def _reschedule(self, claimed: Claimed, *, delay_ms: float, failures: int) -> None:
        self._pending.append(Reschedule(claimed.task_id, claimed.claimed_next, delay_ms, failures, time.monotonic()))
        self._pending_ready.set()

    # -- claiming ---------------------------------------------------------------------------------

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            room = min(self.batch_size, self.max_in_flight - len(self._held))
            if room <= 0:
                self._poll_finished.clear()
                await _wait(stop, IDLE_CLAIM_SECONDS, self._poll_finished)
                continue
            try:
                claimed = await self._claim(room)
            except Exception:
                logger.exception("tracker %s: claiming failed; retrying", self.worker_id)
                await _wait(stop, 1.0)
                continue
            for row in claimed:
                self._start_poll(row)
            if len(claimed) < room:
                await _wait(stop, IDLE_CLAIM_SECONDS)

    def _start_poll(self, claimed: Claimed) -> None:
        if claimed.task_id in self._held:
            return  # moved earlier by someone else while we poll it; the reschedule keeps the earlier time
        if claimed.previous_owner != self.worker_id:
            # It comes from another worker (or from nobody): what we remember of it may be stale.
            self._digests.pop(claimed.task_id, None)
            self._not_found.pop(claimed.task_id, None)
        self.stats.claimed += 1
        self._held.add(claimed.task_id)
        queue = self._queues.get(claimed.server_id)
        if queue is None:
            queue = self._queues[claimed.server_id] = ServerQueue()
            # Twice the request limit: a poller storing a change (an ORM thread) leaves requests to the others.
            queue.pollers = [
                asyncio.create_task(self._poller(queue), name=f"tracker-poller-{claimed.server_id}")
                for _ in range(2 * self.per_server_concurrency)
            ]
        due = asyncio.get_running_loop().time() + claimed.due_in  # claimed ahead of its time: polled at it
        heapq.heappush(queue.heap, (due, next(self._queue_order), claimed))
        queue.ready.set()

    async def _poller(self, queue: ServerQueue) -> None:
        """Poll one server's queued rows, earliest first, each at its time; one of a pool per server, so that a
        poll costs no task, timer or callback of its own."""
        heap, loop = queue.heap, asyncio.get_running_loop()
        while True:
            if not heap:
                if self._draining:
                    return
                queue.ready.clear()
                await queue.ready.wait()
                continue
            due, _, claimed = heapq.heappop(heap)
            # At most the claim-ahead time: a row claimed later and due sooner goes to another poller.
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self._poll(claimed)
            finally:
                self._held.discard(claimed.task_id)
                self._poll_finished.set()

    # -- polling ----------------------------------------------------------------------------------

    async def _poll(self, claimed: Claimed) -> None:
        try:
            link = await self._link(claimed.server_id)
            async with link.semaphore:
                asked_at = datetime.now(UTC)
                snapshot = await link.getter.get_task(claimed.remote_task_id)
            if snapshot.task_id != claimed.remote_task_id:
                raise InvalidResult(f"tasks/get answered about another task, {snapshot.task_id[:80]!r}")
        except IncompleteAnswer as error:
            await self._bad_answer(claimed, error)  # it answered: a broken answer, not an outage
        except (TransportError, RequestTimeout, AuthorizationFailed) as error:
            await self._server_trouble(claimed, error)
        except TaskNotFound as error:
            await self._not_found_answer(claimed, error)
        except (ProtocolError, InvalidResult) as error:
            await self._bad_answer(claimed, error)
        except Exception:
            # A server or a bug must never stop the tracker; the task is tried again later.
            logger.exception("tracker %s: polling task %s failed", self.worker_id, claimed.task_id)
            self._back_off(claimed)
            self.stats.failures += 1
        else:
            try:
                await self._answered(claimed, snapshot, asked_at)
            except Exception:
                logger.exception(
                    "tracker %s: handling the answer about task %s failed", self.worker_id, claimed.task_id
                )
                self._back_off(claimed)
                self.stats.failures += 1
        finally:
            self.stats.polls += 1

    async def _answered(self, claimed: Claimed, snapshot: TaskSnapshot, asked_at: datetime) -> None:
        await self._note_reachable(claimed.server_id)
        self._not_found.pop(claimed.task_id, None)
        digest = snapshot_digest(snapshot)
        known = self._digests.get(claimed.task_id)
        if known is None and claimed.stored_as(snapshot):
            # The first poll since the claim, and the row already says all of it: nothing to store.
            self._digests[claimed.task_id] = digest
        elif known != digest or claimed.asks_beyond_open_requests(snapshot):
            try:
                await self._in_thread(partial(_apply, claimed.task_id, snapshot, asked_at))
            except Exception:
                logger.exception("tracker %s: storing a snapshot of task %s failed", self.worker_id, claimed.task_id)
                self._back_off(claimed)
                return
            self._digests[claimed.task_id] = digest
            self.stats.changes += 1
        if snapshot.is_terminal:
            self._forget(claimed.task_id, claimed.server_id, claimed.remote_task_id)  # its poll row is gone
            return
        interval = snapshot.poll_interval_ms
        if self._covered(claimed):
            interval = max(10 * (interval or DEFAULT_POLL_INTERVAL_MS), SAFETY_NET_MS)
        else:
            self._want_notifications(claimed)
        delay = poll_delay_ms(interval, floor_ms=self.min_interval_ms, cap_ms=self.max_interval_ms)
        self._reschedule(claimed, delay_ms=delay, failures=0)

    async def _server_trouble(self, claimed: Claimed, error: McpClientError) -> None:
        self.stats.failures += 1
        link = self._servers.get(claimed.server_id)
        if link is not None and link.reachable is not False:
            link.reachable = False
            await self._service(partial(_server_failed, claimed.server_id, str(error)), "recording an outage")
        self._back_off(claimed)

    async def _not_found_answer(self, claimed: Claimed, error: TaskNotFound) -> None:
        self.stats.failures += 1
        await self._note_reachable(claimed.server_id)
        if claimed.ttl_passed(datetime.now(UTC)):
            await self._give_up(claimed)
            return
        count = self._not_found[claimed.task_id] = self._not_found.get(claimed.task_id, 0) + 1
        problem = {
            "problem": "the server says it does not know this task, although its TTL has not passed",
            "source": "poll",
            "error": {"code": error.code, "message": _short(error.message)},
        }
        await self._service(partial(_record_poll_problem, claimed.task_id, problem), "recording a protocol error")
        if count >= NOT_FOUND_GIVE_UP:
            await self._give_up(claimed)
        else:
            self._back_off(claimed)

    async def _give_up(self, claimed: Claimed) -> None:
        if await self._service(partial(_expire, claimed.task_id), "expiring a task") is None:
            self._back_off(claimed)
            return
        self._forget(claimed.task_id, claimed.server_id, claimed.remote_task_id)

    async def _bad_answer(self, claimed: Claimed, error: McpClientError) -> None:
        self.stats.failures += 1
        await self._note_reachable(claimed.server_id)
        problem: dict[str, Any] = {"problem": "tasks/get answered something the protocol does not allow"}
        if isinstance(error, IncompleteAnswer):
            problem["problem"] = "the answer to tasks/get broke off or did not finish in time"
        if isinstance(error, ProtocolError):
            problem["error"] = {"code": error.code, "message": _short(error.message)}
        else:
            problem["detail"] = _short(str(error))
        problem["source"] = "poll"
        await self._service(partial(_record_poll_problem, claimed.task_id, problem), "recording a protocol error")
        self._back_off(claimed)

    def _back_off(self, claimed: Claimed) -> None:
        failures = claimed.failures + 1
        delay = backoff_delay_ms(failures, base_seconds=self.backoff_base_seconds, cap_seconds=self.backoff_cap_seconds)
        self._reschedule(claimed, delay_ms=max(delay, self.min_interval_ms), failures=failures)

    def _forget(self, task_id: uuid.UUID, server_id: int, remote_task_id: str) -> None:
        self._digests.pop(task_id, None)
        self._notification_problems.pop(task_id, None)
        self._not_found.pop(task_id, None)
        link = self._servers.get(server_id)
        if link is not None and link.watch is not None:
            link.watch.wanted.pop(remote_task_id, None)
            link.watch.queued.discard(remote_task_id)
            link.watch.refused.discard(remote_task_id)

    async def _note_reachable(self, server_id: int) -> None:
        link = self._servers.get(server_id)
        if link is not None and link.reachable is not True:
            link.reachable = True
            await self._service(partial(_server_answered, server_id), "recording a recovery")

    # -- subscriptions ------------------------------------------------------------------------------

    def _covered_task_ids(self) -> list[uuid.UUID]:
        watches = [link.watch for link in self._servers.values() if link.watch is not None]
        return [watch.wanted[remote] for watch in watches for remote in watch.covered if remote in watch.wanted]

    def _covered(self, claimed: Claimed) -> bool:
        link = self._servers.get(claimed.server_id)
        return link is not None and link.watch is not None and claimed.remote_task_id in link.watch.covered

    def _want_notifications(self, claimed: Claimed) -> None:
        """Queue a held live task for the server's next subscription, unless the server cannot listen."""
        link = self._servers.get(claimed.server_id)
        if not self.listen or link is None or self._stopping:
            return
        watch = link.watch
        if watch is None:
            watch = link.watch = self._new_watch(link)
            watch.runner = asyncio.create_task(self._watch_loop(claimed.server_id, watch), name="tracker-listen")
        remote_task_id = claimed.remote_task_id
        if watch.supported is False or any(remote_task_id in ids for ids in (watch.queued, watch.asked, watch.refused)):
            return
        watch.wanted[remote_task_id] = claimed.task_id
        watch.queued.add(remote_task_id)
        watch.wake.set()

    def _new_watch(self, link: ServerLink) -> ServerWatch:
        # A stdio getter is already an SDK client, and a second one would start a second server process.
        if isinstance(link.getter, TasksClient):
            return ServerWatch(client=link.getter, owns_client=False)
        return ServerWatch(client=TasksClient(link.target, timeout=self.request_timeout), owns_client=True)

    async def _watch_loop(self, server_id: int, watch: ServerWatch) -> None:
        """Open one subscription per batch of newly held tasks; several subscriptions coexist."""
        while True:
            await watch.wake.wait()
            await asyncio.sleep(SUBSCRIBE_COALESCE_SECONDS)
            watch.wake.clear()
            batch, watch.queued = sorted(watch.queued), set()
            if not batch or watch.supported is False:
                continue
            watch.asked.update(batch)
            subscription = asyncio.create_task(self._subscribe(server_id, watch, batch), name="tracker-subscription")
            watch.subscriptions.add(subscription)
            subscription.add_done_callback(watch.subscriptions.discard)

    async def _subscribe(self, server_id: int, watch: ServerWatch, task_ids: list[str]) -> None:
        accepted: set[str] = set()
        not_ours = 0
        try:
            async with watch.client.listen(task_ids) as subscription:
                subscription.on_problem = partial(self._notification_problem, watch, server_id)
                watch.supported = True
                accepted = set(subscription.accepted_task_ids) & set(task_ids)
                watch.covered |= accepted
                watch.refused |= set(task_ids) - accepted
                async for snapshot in subscription:
                    if not await self._notified(watch, snapshot):
                        not_ours += 1
                        if not_ours == 1:
                            logger.info(
                                "tracker %s: ignored a task notification from server %s about %.80r, "
                                "a task it does not follow (further ones counted when the subscription ends)",
                                self.worker_id,
                                server_id,
                                snapshot.task_id,
                            )
        except (MethodNotFound, MissingCapability) as error:
            watch.supported = False
            logger.info("tracker %s: server %s cannot listen for tasks (%s); polling", self.worker_id, server_id, error)
        except McpClientError as error:
            # Lost or refused: the tasks go back to plain polling, and the next answered poll queues them again.
            logger.info("tracker %s: task subscription on server %s ended: %s", self.worker_id, server_id, error)
        except Exception:
            logger.exception("tracker %s: task subscription on server %s failed", self.worker_id, server_id)
        finally:
            watch.covered -= accepted
            watch.asked.difference_update(task_ids)
            if not_ours > 1:
                logger.info(
                    "tracker %s: ignored %d task notifications from server %s about tasks it does not follow",
                    self.worker_id,
                    not_ours,
                    server_id,
                )
        # Ended without being stopped: its live tasks must not wait for the safety-net poll.
        still_live = [watch.wanted[remote] for remote in accepted if remote in watch.wanted]
        try:
            await self._pull_in(still_live)
        except Exception:
            logger.exception("tracker %s: rescheduling tasks after a subscription ended failed", self.worker_id)

    def _notification_problem(self, watch: ServerWatch, server_id: int, remote_task_id: Any, problem: str) -> None:
        task_id = watch.wanted.get(remote_task_id) if isinstance(remote_task_id, str) else None
        if task_id is None:
            logger.info(
                "tracker %s: ignored a malformed task notification from server %s about no task it follows (%.80r): %s",
                self.worker_id,
                server_id,
                remote_task_id,
                _short(problem),
            )
            return
        data = {"problem": "a task notification was not one the protocol allows", "detail": _short(problem)}
        data["source"] = "notification"
        if self._notification_problems.get(task_id) == data["detail"]:
            return  # a flood of the same problem costs no database work
        self._notification_problems[task_id] = data["detail"]
        recording = asyncio.create_task(
            self._service(partial(_record_poll_problem, task_id, data), "recording a protocol error")
        )
        self._background.add(recording)
        recording.add_done_callback(self._background.discard)

    async def _notified(self, watch: ServerWatch, snapshot: TaskSnapshot) -> bool:
        """Store a notified snapshot of a task this worker follows; False when it follows no such task."""
        task_id = watch.wanted.get(snapshot.task_id)
        if task_id is None:
            return False
        self._notification_problems.pop(task_id, None)
        self.stats.notifications += 1
        digest = snapshot_digest(snapshot)
        if self._digests.get(task_id) != digest:
            applied = await self._service(
                partial(_apply, task_id, snapshot, source="notification"), "storing a notified snapshot"
            )
            if applied is None:
                return True  # polling will bring it again
            self._digests[task_id] = digest
            self.stats.changes += 1
        if snapshot.is_terminal:
            self._digests.pop(task_id, None)
            watch.wanted.pop(snapshot.task_id, None)
        return True

    async def _stop_watch(self, watch: ServerWatch) -> None:
        tasks = [task for task in (watch.runner, *watch.subscriptions) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if watch.owns_client:
            with contextlib.suppress(Exception):
                await watch.client.aclose()

    # -- servers ------------------------------------------------------------------------------------

    async def _link(self, server_id: int) -> ServerLink:
        link = self._servers.get(server_id)
        if link is not None and time.monotonic() - link.loaded_at < SERVER_REFRESH_SECONDS:
            return link
        async with self._server_lock:
            link = self._servers.get(server_id)
            if link is not None and time.monotonic() - link.loaded_at < SERVER_REFRESH_SECONDS:
                return link
            target = await self._in_thread(partial(_load_target, server_id))
            if link is not None and link.target == target:
                link.loaded_at = time.monotonic()
                return link
            if link is not None:
                # Its settings changed: polls in flight finish on the old getter, closed with the tracker.
                link.retired.append(link.getter)
                link.getter = self._getter(target)
                link.target, link.loaded_at = target, time.monotonic()
                return link
            link = ServerLink(
                getter=self._getter(target),
                semaphore=asyncio.Semaphore(self.per_server_concurrency),
                target=target,
                loaded_at=time.monotonic(),
            )
            self._servers[server_id] = link
            return link

    def _getter(self, target) -> TaskGetter:
        return task_getter(target, timeout=self.request_timeout, concurrency=self.per_server_concurrency)

    # -- the ORM, off the event loop ------------------------------------------------------------------

    async def _in_thread(self, work: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _fresh_connection, work, self._thread_connections, self.stats)

    async def _service(self, work: Callable[[], Any], what: str) -> Any:
        """Run a service call; a failure is logged and answered with None, never raised into a poll."""
        try:
            return await self._in_thread(work)
        except Exception:
            logger.exception("tracker %s: %s failed", self.worker_id, what)
            return None


async def _wait(stop: asyncio.Event, seconds: float, *others: asyncio.Event) -> bool:
    """Sleep up to `seconds`, less if `stop` (or another event) is set; True when `stop` is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in (stop, *others)]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return stop.is_set()
