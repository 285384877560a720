"""Worker heartbeats, and what the other workers do when one stops beating.

Every `manage.py worker` beats its row in `worker_heartbeat` (keyed by its name, the owner written in the leases it
holds) every TASKHUB_WORKER_HEARTBEAT_SECONDS, on a connection of its own, from the database's clock. On each beat it
also looks for the dead: an owner silent for TASKHUB_STALLED_WORKER_SECONDS loses its task leases at once (released
and due now, so every live tracker's next claim, a tenth of a second away, takes them), and the jobs procrastinate
says were running in a dead job runner are queued again at once (`retry_stalled_jobs_sql`; the once-a-minute sweep in
sweeps.py stays as a safety net). Both statements are safe with any number of workers running them at once: each row
is taken by one of them (FOR UPDATE SKIP LOCKED, and the row no longer matches once taken).

A worker judges others only after it has itself beaten for TASKHUB_STALLED_WORKER_SECONDS without a failure: after a
database outage every worker is silent for a while, and none must take the others' work because it was the first
one back.

What a recovered job may do is the jobs' own business (jobs.py): a launch that may have been sent is never sent
again; an answer whose delivery was cut off is sent again only once the server says it still waits for it and the
attempt has settled: TASKHUB_DEAD_WORKER_GRACE_SECONDS after `taken_over_at` when the attempt's worker was taken
over, the long TASKHUB_DELIVERY_SETTLE_SECONDS otherwise. A worker claims a delivery only while its own beat is
fresh (`beating(owner)`, FRESH_BEAT) and sends within CLAIM_HOLDS_SECONDS of that claim, so a worker that was only
paused cannot send an answer after another took its delivery over (jobs.py, `_send_answer`).

`dead_owners` / `is_alive` answer, for any lease keyed by a worker name (the tracker's, a stdio server's), whether
its owner is known dead or alive. An owner with no row is neither (a tracker run outside `manage.py worker`, an
owner gone for more than FORGET_AFTER): leave its leases to their expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection
from django.db.models import Exists, Q
from django.db.models.functions import Now

from taskhub import procrastinate_sql
from taskhub.tasks.services import held_questions, session_tasks
from taskhub.worker.models import WorkerHeartbeat
from taskhub.worker.orm import db

logger = logging.getLogger(__name__)

# A dead owner's row is kept this long (dead_owners can name it), then deleted.
FORGET_AFTER = timedelta(days=1)

BEAT_SQL = """
INSERT INTO worker_heartbeat (owner, started_at, beat_at, taken_over_at)
VALUES (%(owner)s, now(), now(), NULL)
ON CONFLICT (owner) DO UPDATE SET beat_at = now(), taken_over_at = NULL
"""

# The leases of each owner silent too long, released and due at once (its task leases, and its stdio servers');
# the owner marked as taken over (one worker does it, the others skip the row).
# Returns (owner, seconds silent, task leases released).
TAKE_OVER_SQL = """
WITH dead AS (
    UPDATE worker_heartbeat AS beat SET taken_over_at = now()
    FROM (
        SELECT owner FROM worker_heartbeat
        WHERE taken_over_at IS NULL AND beat_at < now() - %(stalled)s AND owner <> %(me)s
        FOR UPDATE SKIP LOCKED
    ) AS silent
    WHERE beat.owner = silent.owner
    RETURNING beat.owner, EXTRACT(EPOCH FROM now() - beat.beat_at)::float8 AS silent_seconds
), released AS (
    UPDATE tasks_taskpoll AS poll
    SET lease_owner = '', lease_expires_at = NULL, next_poll_at = LEAST(poll.next_poll_at, now())
    FROM dead
    WHERE poll.lease_owner = dead.owner
    RETURNING dead.owner
), stdio_released AS (
    -- its stdio servers' leases expire now (worker/stdio/leases.py): the next claim of a live worker takes them
    UPDATE servers_serverprocess AS process SET lease_expires_at = now()
    FROM dead
    WHERE process.lease_owner = dead.owner AND process.lease_expires_at > now()
    RETURNING dead.owner
)
SELECT dead.owner, dead.silent_seconds, (SELECT count(*) FROM released WHERE released.owner = dead.owner)
FROM dead
"""

FORGET_SQL = "DELETE FROM worker_heartbeat WHERE beat_at < now() - %(forget_after)s"

STOPPED_SQL = "DELETE FROM worker_heartbeat WHERE owner = %(owner)s"

DEAD_OWNERS_SQL = "SELECT owner FROM worker_heartbeat WHERE owner = ANY(%(owners)s) AND beat_at < now() - %(stalled)s"
ALIVE_SQL = "SELECT EXISTS (SELECT 1 FROM worker_heartbeat WHERE owner = %(owner)s AND beat_at >= now() - %(stalled)s)"


# The name (the heartbeat row's owner) of the worker this code runs in; "" outside `manage.py worker`. Set by the
# worker command before it starts its parts, so every job it runs sees it.
RUNNING_AS: contextvars.ContextVar[str] = contextvars.ContextVar("taskhub_worker_running_as", default="")

# A worker claims a delivery only if it beat within this long: two beats (one may be late), or half the stalled time
# if that is longer (a loaded machine's beats may be late by more than a beat).
FRESH_BEAT = timedelta(
    seconds=max(2 * settings.TASKHUB_WORKER_HEARTBEAT_SECONDS, settings.TASKHUB_STALLED_WORKER_SECONDS / 2)
)
# ... and must send within this long of that claim, or claim again. Another worker can take the delivery over only
# once the claimant is silent for TASKHUB_STALLED_WORKER_SECONDS, i.e. no sooner than (stalled - FRESH_BEAT) after
# the claim, plus the dead-worker grace: half of that leaves room for clocks and the database's own delays.
CLAIM_HOLDS_SECONDS = (settings.TASKHUB_STALLED_WORKER_SECONDS - FRESH_BEAT.total_seconds()) / 2


def web_send_ends_seconds() -> float:
    """How long after its claim the web process may still be sending an answer it claimed (taskhub/gateway/
    sending.py): it sends only while the claim holds, and waits for the answer as long as the delivery job does."""
    return CLAIM_HOLDS_SECONDS + settings.TASKHUB_DELIVERY_TIMEOUT_SECONDS


def claim_clock() -> float:
    """Seconds, for how old a claim is: CLOCK_BOOTTIME where there is one (Linux), which, unlike the monotonic clock,
    also counts the time the machine was suspended; never set back."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


# A worker silent for TASKHUB_STALLED_WORKER_SECONDS is taken over by the next beat of a steady worker: within a beat.
TAKE_OVER_DUE = timedelta(seconds=settings.TASKHUB_WORKER_HEARTBEAT_SECONDS)


def stalled_after() -> timedelta:
    return timedelta(seconds=settings.TASKHUB_STALLED_WORKER_SECONDS)


# --- asking (Django's connection: sync code, or through sync_to_async) ----------------------------------------------


def dead_owners(owners: Iterable[str]) -> set[str]:
    """Those of `owners` known dead: their worker has not beaten for TASKHUB_STALLED_WORKER_SECONDS.

    An owner with no heartbeat row is not in the answer (nobody knows it): its leases expire by themselves."""
    owners = [owner for owner in dict.fromkeys(owners) if owner]
    if not owners:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(DEAD_OWNERS_SQL, {"owners": owners, "stalled": stalled_after()})
        return {owner for (owner,) in cursor.fetchall()}


def is_alive(owner: str) -> bool:
    """Whether the worker named `owner` beat within TASKHUB_STALLED_WORKER_SECONDS."""
    with connection.cursor() as cursor:
        cursor.execute(ALIVE_SQL, {"owner": owner, "stalled": stalled_after()})
        return bool(cursor.fetchone()[0])


def is_silent(owner: str) -> bool:
    """Whether the worker named `owner` is known and has not beaten for TASKHUB_STALLED_WORKER_SECONDS: dead, though
    maybe not yet taken over (the next beat of a steady worker does that, within TAKE_OVER_DUE)."""
    return bool(owner) and bool(dead_owners([owner]))


def taken_over_at(owner: str) -> datetime | None:
    """When another worker found `owner` dead and took its work over; None while it is alive (a beat clears it), or
    unknown (no row: a clean stop deletes it, and then the long settle applies)."""
    if not owner:
        return None
    return WorkerHeartbeat.objects.filter(owner=owner).values_list("taken_over_at", flat=True).first()


def _beating_rows(owner: str):
    return WorkerHeartbeat.objects.filter(owner=owner, beat_at__gte=Now() - FRESH_BEAT, taken_over_at__isnull=True)


def beating(owner: str) -> Q:
    """A condition for an UPDATE: `owner` beat within FRESH_BEAT (the database's clock) and was not taken over."""
    return Q(Exists(_beating_rows(owner)))


@functools.cache
def _beating_sql(owner: str) -> tuple[str, tuple]:
    rows = _beating_rows(owner).values("pk")
    sql, params = rows.query.sql_with_params()
    return f"EXISTS ({sql})", tuple(params)


def beating_sql(owner: str) -> tuple[str, tuple]:
    """`beating(owner)` as SQL and its parameters, for a statement written in SQL (services.first_claim)."""
    return _beating_sql(owner)


def is_beating(owner: str) -> bool:
    """Whether `owner` may claim work now (see `beating`)."""
    return _beating_rows(owner).exists()


def retry_stalled_jobs_sql(cursor: Any) -> list[tuple[int, str]]:
    """Queue again, at once, the running jobs of job runners silent too long; (job id, task name) of each."""
    return procrastinate_sql.retry_stalled_jobs(cursor, stalled=stalled_after())


def log_retried(jobs: list[tuple[int, str]]) -> None:
    for job_id, task_name in jobs:
        logger.warning("retrying job %s (%s): its worker stopped", job_id, task_name)


# --- beating --------------------------------------------------------------------------------------------------------


class Heartbeat:
    """One worker's heartbeat and its watch over the others, on a psycopg connection of its own (autocommit).

    `await heartbeat.beat()` once before the worker takes any lease (so its row exists), then `run(stop)`; on a
    clean stop the row is deleted (the worker released what it held: nothing of it is left to take over)."""

    def __init__(
        self,
        *,
        owner: str,
        connection_params: Callable[[], Awaitable[dict[str, Any]]],
        every: float | None = None,
        stalled_after_seconds: float | None = None,
    ) -> None:
        self.owner = owner
        self.every = settings.TASKHUB_WORKER_HEARTBEAT_SECONDS if every is None else every
        self.stalled = timedelta(
            seconds=settings.TASKHUB_STALLED_WORKER_SECONDS if stalled_after_seconds is None else stalled_after_seconds
        )
        self._connection_params = connection_params
        self._db: psycopg.AsyncConnection | None = None
        self._steady_since: float | None = None  # time.monotonic() of the first beat after a failure

    async def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        if self._db is None or self._db.closed or self._db.broken:
            params_ = await self._connection_params()
            self._db = await psycopg.AsyncConnection.connect(autocommit=True, **params_)
        cursor = await self._db.execute(sql, params)
        return await cursor.fetchall() if cursor.description else []

    async def beat(self) -> None:
        await self._execute(BEAT_SQL, {"owner": self.owner})

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while True:
                await self._once()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.every)
                if stop.is_set():
                    break
            with contextlib.suppress(Exception):
                await self._execute(STOPPED_SQL, {"owner": self.owner})
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._db is not None:
            with contextlib.suppress(Exception):
                await self._db.close()

    async def _once(self) -> None:
        try:
            await self.beat()
        except Exception as error:
            if self._steady_since is not None:
                logger.warning("worker %s: heartbeat failed (%s); retrying", self.owner, error)
            self._steady_since = None
            return
        now = time.monotonic()
        if self._steady_since is None:
            self._steady_since = now
        if now - self._steady_since < self.stalled.total_seconds():
            return  # not beating long enough to tell a dead worker from one that is reconnecting too
        try:
            await self.take_over()
        except Exception:
            logger.exception("worker %s: taking over the work of stopped workers failed", self.owner)

    async def take_over(self) -> None:
        """Release the leases of owners silent too long, and queue again the jobs of job runners silent too long."""
        dead = []
        for owner, silent, released in await self._execute(TAKE_OVER_SQL, {"stalled": self.stalled, "me": self.owner}):
            logger.warning(
                "worker %s: worker %s has not beaten for %.1f s; its %d task lease(s) are released to the others",
                self.owner,
                owner,
                silent,
                released,
            )
            dead.append(owner)
        if dead:  # the calls it held open died with it: the questions asked on them can no longer be answered
            closed = await db(held_questions.close_questions_held_by, worker_ids=dead)
            if closed:
                logger.warning("worker %s: %d question(s) held by %s closed", self.owner, closed, ", ".join(dead))
            handed_on = await db(session_tasks.hand_on_tasks_followed_by, worker_ids=dead)
            if handed_on:
                logger.warning(
                    "worker %s: %d task(s) followed on sessions of %s handed on", self.owner, handed_on, ", ".join(dead)
                )
        rows = await self._execute(procrastinate_sql.RETRY_STALLED_JOBS_SQL, {"stalled": self.stalled})
        log_retried([(job_id, task_name) for job_id, task_name, _ in rows])
        await self._execute(FORGET_SQL, {"forget_after": FORGET_AFTER})
