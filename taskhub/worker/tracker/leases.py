"""The tracker's leases on `tasks_taskpoll` rows: claim, reschedule, renew, pull in, release.

Raw SQL on a psycopg `AsyncConnection` of the tracker's own (autocommit), not the ORM: this is the hot path.
A claim takes a batch of due rows in one UPDATE … RETURNING (joined with the task for what a poll needs),
and reschedules are written in batches by one UPDATE … FROM unnest(…) every few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from taskhub.mcp.wire import DEFAULT_POLL_INTERVAL_MS, TaskSnapshot
from taskhub.tasks import services
from taskhub.tasks.models import LIVE_STATUSES, Task, TaskStatus
from taskhub.worker.tracker.polling import TrackerStats
from taskhub.worker.waiting import wait

logger = logging.getLogger(__package__)

# Reschedules are written together, this often at most; each row's time counts from its answer, not the write.
FLUSH_COALESCE_SECONDS = 0.05

# A row is due when its time has come and nobody else holds a live lease on it; the rows this
# worker holds are claimed again by the same statement when they fall due. Rows of a disabled server
# are left where they are (their time passed, so they are claimed at once when it is enabled again).
# With `stdio_leases` (a worker running stdio servers' processes, worker/stdio/), a stdio server's rows are
# claimed only by the worker holding that server's lease: its polls must reach the process that has the task.
#
# Whether a row's server may be polled is a scalar subquery, asked of each row as the next_poll_at index hands the
# rows over in order, until the batch is full (ORDERED_WALK). Written as EXISTS (…), Postgres could turn it into a
# join, and did where its statistics made that look cheaper: it read every task of every enabled server and sorted all
# the due rows on every claim, 40-60 ms a batch of 500 at 20,000 tasks (bench/tracker.py), against 6-10 ms so; the
# tracker's connection was held meanwhile, and Postgres's CPU taken from the servers being polled.
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
      AND (SELECT server.enabled
                  AND (NOT %(stdio_leases)s OR server.transport <> 'stdio' OR EXISTS (
                      SELECT 1 FROM servers_serverprocess AS process WHERE process.server_id = server.id
                      AND process.lease_owner = %(owner)s AND process.lease_expires_at > now()))
           FROM tasks_task AS task JOIN servers_server AS server ON server.id = task.server_id
           WHERE task.id = tasks_taskpoll.task_id)
    ORDER BY next_poll_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS due, tasks_task AS task
WHERE poll.task_id = due.task_id AND task.id = poll.task_id
RETURNING poll.task_id, due.previous_owner, poll.next_poll_at, poll.consecutive_failures,
          GREATEST(EXTRACT(EPOCH FROM due.due_at - now()), 0)::float8 AS due_in,
          task.remote_task_id, task.server_id, task.poll_interval_ms, task.ttl_ms, task.remote_created_at,
          task.expires_at,
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

# Set for each claim, in its own transaction: a claim takes the due rows in next_poll_at's order from its index and
# stops when the batch is full. Where its statistics or costs made reading every due row and sorting them all look
# cheaper, Postgres did that instead, asking each row's server on the way, on every claim (tests/test_tracker.py).
# With sorts off it walks the index. LOCAL, so that it ends with the claim's transaction: a pooler in transaction mode
# (README, "prepared statements") hands the connection to others after it.
ORDERED_WALK = "SET LOCAL enable_sort = off"

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

# Of the tasks this worker follows, those it no longer holds: another worker took the lease (this one was thought
# dead, or let it expire; the new owner is named), or the task ended (no owner: its row is gone).
NOT_HELD_SQL = """
SELECT followed.task_id, poll.lease_owner FROM unnest(%(ids)b::uuid[]) AS followed(task_id)
LEFT JOIN tasks_taskpoll AS poll ON poll.task_id = followed.task_id
WHERE poll.lease_owner IS DISTINCT FROM %(owner)s
"""

RELEASE_SQL = "UPDATE tasks_taskpoll SET lease_owner = '', lease_expires_at = NULL WHERE lease_owner = %(owner)s"


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__, per claimed row
class Claimed:
    """A row this worker just claimed, with what polling it needs."""

    task_id: uuid.UUID
    previous_owner: str
    claimed_next: datetime
    failures: int
    due_in: float  # seconds from now until the row's time (as claim() hands it over): the poll waits for it
    remote_task_id: str
    server_id: int
    poll_interval_ms: int | None
    ttl_ms: int | None
    remote_created_at: str
    expires_at: datetime | None  # when the task may be given up (taskhub/tasks/ttl.py)
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
        return self.expires_at is not None and now > self.expires_at


@dataclass(slots=True)
class Reschedule:
    task_id: uuid.UUID
    claimed_next: datetime
    delay_ms: float
    failures: int
    at: float  # time.monotonic() when decided: the delay counts from then, however late the write


class Leases:
    """One worker's leases, on its own connection: the statements above, and the reschedules waiting to be written."""

    def __init__(
        self,
        *,
        owner: str,
        lease: timedelta,
        claim_ahead: timedelta,
        stats: TrackerStats,
        connection_params: Callable[[], Awaitable[dict[str, Any]]],
        stdio_leases: bool = False,
    ) -> None:
        self.owner = owner
        self.stdio_leases = stdio_leases
        self.lease = lease
        self.claim_ahead = claim_ahead
        self.stats = stats
        self.pending_ready = asyncio.Event()
        self._connection_params = connection_params
        self._db: psycopg.AsyncConnection | None = None
        self._db_lock = asyncio.Lock()
        self._pending: list[Reschedule] = []

    async def connect(self) -> None:
        params = await self._connection_params()
        self._db = await psycopg.AsyncConnection.connect(autocommit=True, **params)

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()

    async def execute(self, sql: str, params: dict[str, Any], *, ordered_walk: bool = False) -> list[tuple]:
        rows, _ = await self._execute(sql, params, ordered_walk=ordered_walk)
        return rows

    async def _execute(
        self, sql: str, params: dict[str, Any] | Callable[[], dict[str, Any]], *, ordered_walk: bool = False
    ) -> tuple[list[tuple], float]:
        """The statement's rows, and the loop time when it was sent (its `now()` is a moment later). `params` may
        be a function making them as the statement is sent, once the connection is free (a claim may hold it for
        tens of milliseconds). `ordered_walk`: in a transaction of its own with ORDERED_WALK (its `now()` is then
        the transaction's start, still after the time returned)."""
        async with self._db_lock:
            if self._db is None or self._db.closed or self._db.broken:
                await self.connect()
            assert self._db is not None
            self.stats.own_statements += 4 if ordered_walk else 1  # BEGIN, SET LOCAL and COMMIT are trips too
            sent_at = asyncio.get_running_loop().time()
            async with self._db.transaction() if ordered_walk else contextlib.nullcontext():
                if ordered_walk:
                    await self._db.execute(ORDERED_WALK)
                cursor = await self._db.execute(sql, params() if callable(params) else params)
                return (await cursor.fetchall() if cursor.description else []), sent_at

    async def claim(self, limit: int) -> list[Claimed]:
        params = {"owner": self.owner, "lease": self.lease, "limit": limit, "ahead": self.claim_ahead}
        params["stdio_leases"] = self.stdio_leases
        rows, sent_at = await self._execute(CLAIM_SQL, params, ordered_walk=True)
        self.stats.claim_statements += 1
        claimed = [Claimed(*row) for row in rows]
        # Each row's due_in counts from the statement's now(), when it was sent, not from its rows' arrival: the
        # 10-40 ms a claim of hundreds of rows takes would otherwise make every poll that much late.
        spent = asyncio.get_running_loop().time() - sent_at
        for row in claimed:
            row.due_in = max(row.due_in - spent, 0.0)
        return claimed

    def reschedule(self, claimed: Claimed, *, delay_ms: float, failures: int) -> None:
        self._pending.append(Reschedule(claimed.task_id, claimed.claimed_next, delay_ms, failures, time.monotonic()))
        self.pending_ready.set()

    async def flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return

        def params() -> dict[str, Any]:
            # Each delay counts down to the moment the statement is sent: its now() is where the database counts from.
            now = time.monotonic()
            return {
                "owner": self.owner,
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

    async def flush_loop(self, flushing: asyncio.Event) -> None:
        while not flushing.is_set():
            await self.pending_ready.wait()
            self.pending_ready.clear()
            await asyncio.sleep(FLUSH_COALESCE_SECONDS)
            try:
                await self.flush()
            except Exception:
                logger.exception("tracker %s: rescheduling failed; retrying", self.owner)
                await asyncio.sleep(1)
                self.pending_ready.set()

    async def renew_loop(self, stop: asyncio.Event) -> None:
        every = self.lease.total_seconds() / 3
        while not await wait(stop, every):
            try:
                await self.execute(RENEW_SQL, {"owner": self.owner, "lease": self.lease})
            except Exception:
                logger.exception("tracker %s: renewing leases failed", self.owner)

    async def pull_in(self, task_ids: list[uuid.UUID]) -> None:
        if task_ids:
            params = {"ids": task_ids, "owner": self.owner, "default_ms": DEFAULT_POLL_INTERVAL_MS}
            await self.execute(PULL_IN_SQL, params)

    async def not_held(self, task_ids: list[uuid.UUID]) -> dict[uuid.UUID, str | None]:
        """Those of `task_ids` this worker no longer holds, each with its owner now (None: the task ended)."""
        if not task_ids:
            return {}
        rows = await self.execute(NOT_HELD_SQL, {"ids": task_ids, "owner": self.owner})
        return dict(rows)

    async def release(self) -> None:
        await self.execute(RELEASE_SQL, {"owner": self.owner})
