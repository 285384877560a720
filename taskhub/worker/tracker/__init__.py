"""The tracker: follows live tasks by polling `tasks/get`, across any number of worker processes.

How it shares the work (Postgres alone coordinates):
- Each worker claims due rows of the narrow `tasks_taskpoll` table in batches (`FOR UPDATE SKIP
  LOCKED`) and writes itself in as the lease owner. A lease is sticky: after each poll the worker
  reschedules the row and keeps (extends) the lease, and a renewal statement keeps the leases of rows
  it holds between polls. A worker that dies stops renewing; once its leases expire another worker's
  claim takes the rows over. On stop the worker finishes its in-flight polls and releases its leases
  (`lease_owner = ''`, the column is not nullable), so another worker can take them at once.
- A stdio server's tasks live in its one process, which runs in the worker holding the server's lease
  (taskhub/worker/stdio/): a tracker given the worker's stdio processes (`stdio`) claims those tasks only
  there, and polls and subscribes through that process. When the server says it does not know a task that
  was sent before the current process started, the task is `lost` (`services.mark_lost`), not expired.
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
changes hands. So an unchanged poll costs its share of one reschedule. The request itself is the lean
getter's (taskhub/mcp/lean.py): pre-encoded bytes on kept connections, and an answer that repeats the last
one is neither validated nor digested again.

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

The parts: `leases` (the SQL on `tasks_taskpoll` and its row types), `pollers` (the due-time heap and the
fixed pool of pollers per server), `subscriptions` (`subscriptions/listen`), `orm` (the service calls, in
the tracker's threads) and `polling` (timing, digests, counters); the `Tracker` below composes them and
decides what each answer means.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol

from taskhub.database.params import database_params
from taskhub.mcp.client import StdioTarget, TasksClient
from taskhub.mcp.errors import (
    AuthorizationFailed,
    IncompleteAnswer,
    InvalidResult,
    McpClientError,
    ProtocolError,
    RequestTimeout,
    TaskNotFound,
    TransportError,
)
from taskhub.mcp.lean import TaskGetter, task_getter
from taskhub.mcp.wire import DEFAULT_POLL_INTERVAL_MS, TaskSnapshot
from taskhub.observability import metrics, tracing
from taskhub.worker.stdio import ProcessElsewhere
from taskhub.worker.tracker import orm
from taskhub.worker.tracker.leases import Claimed, Leases
from taskhub.worker.tracker.pollers import PollerPool
from taskhub.worker.tracker.polling import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_CAP_SECONDS,
    CLAIM_AHEAD_SECONDS,
    IDLE_CLAIM_SECONDS,
    MAX_POLL_INTERVAL_MS,
    MIN_POLL_INTERVAL_MS,
    NOT_FOUND_GIVE_UP,
    SAFETY_NET_MS,
    SERVER_REFRESH_SECONDS,
    STATS_LOG_SECONDS,
    TrackerStats,
    backoff_delay_ms,
    poll_delay_ms,
    short,
    snapshot_digest,
)
from taskhub.worker.tracker.subscriptions import Subscriptions
from taskhub.worker.waiting import wait

__all__ = ["Tracker"]

logger = logging.getLogger(__name__)


class StdioProcesses(Protocol):
    """What the tracker asks the worker's stdio supervisor (taskhub.worker.stdio.supervisor)."""

    def client(self, server_id: int) -> TasksClient: ...

    def process_started_at(self, server_id: int) -> datetime | None: ...


class OwnedProcessGetter:
    """`tasks/get` and `subscriptions/listen` through the worker's process of a stdio server, whichever process
    runs it at the moment (it is replaced when it exits); closing it leaves the process alone."""

    def __init__(self, stdio: StdioProcesses, server_id: int) -> None:
        self._stdio = stdio
        self._server_id = server_id

    async def get_task(self, task_id: str) -> TaskSnapshot:
        return await self._stdio.client(self._server_id).get_task(task_id)

    def listen(self, task_ids):
        return self._stdio.client(self._server_id).listen(task_ids)

    async def aclose(self) -> None:
        pass


@dataclass
class ServerLink:
    """How the tracker reaches one server: its getter, its concurrency limit, whether it answers."""

    getter: TaskGetter
    semaphore: asyncio.Semaphore
    target: Any
    loaded_at: float
    reachable: bool | None = None  # unknown until this worker has tried
    retired: list[TaskGetter] = field(default_factory=list)


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
        stdio: StdioProcesses | None = None,
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
        # The worker's stdio servers (worker/stdio/): their tasks are claimed only where their process runs, and
        # polled through it. None: each stdio server gets a process of the tracker's own (a tracker on its own).
        self.stdio = stdio
        self.stats = TrackerStats()
        self._service_threads = service_threads
        self._executor: ThreadPoolExecutor | None = None
        self._thread_connections: set = set()
        self._servers: dict[int, ServerLink] = {}
        self._server_lock = asyncio.Lock()
        self._digests: dict[uuid.UUID, bytes] = {}
        # Each task's last snapshot and its digest: a getter that hands back the same object is not digested again.
        self._last_snapshots: dict[uuid.UUID, tuple[TaskSnapshot, bytes]] = {}
        self._not_found: dict[uuid.UUID, int] = {}
        self._background: set[asyncio.Task] = set()
        self._stopping = False
        self._leases = Leases(
            owner=worker_id,
            lease=self.lease,
            claim_ahead=self.claim_ahead,
            stats=self.stats,
            connection_params=partial(self._in_thread, database_params),
            stdio_leases=stdio is not None,
        )
        # Twice the request limit: a poller storing a change (an ORM thread) leaves requests to the others.
        self._pollers = PollerPool(pollers_per_server=2 * per_server_concurrency, poll=self._poll)
        self._subscriptions = Subscriptions(
            worker_id=worker_id,
            request_timeout=self.request_timeout,
            stats=self.stats,
            digests=self._digests,
            service=self._service,
            pull_in=self._leases.pull_in,
            background=self._background,
        )

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._executor = ThreadPoolExecutor(self._service_threads, thread_name_prefix=f"tracker-{self.worker_id}")
        flushing = asyncio.Event()
        helpers: list[asyncio.Task] = []
        try:
            await self._leases.connect()
            helpers = [
                asyncio.create_task(self._leases.flush_loop(flushing), name="tracker-flush"),
                asyncio.create_task(self._leases.renew_loop(stop), name="tracker-renew"),
            ]
            if self.listen:
                helpers.append(asyncio.create_task(self._lost_leases_loop(stop), name="tracker-lost-leases"))
            if STATS_LOG_SECONDS > 0:
                helpers.append(asyncio.create_task(self._stats_loop(stop), name="tracker-stats"))
            await self._claim_loop(stop)
        finally:
            await self._wind_down(helpers, flushing)

    async def _wind_down(self, helpers: list[asyncio.Task], flushing: asyncio.Event) -> None:
        self._stopping = True
        await self._pollers.drain()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        flushing.set()
        self._leases.pending_ready.set()
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._leases.flush()
        try:
            await self._leases.pull_in(self._subscriptions.covered_task_ids())
            await self._leases.release()
        except Exception:
            logger.exception("tracker %s could not release its leases; they expire by themselves", self.worker_id)
        for server_id, link in self._servers.items():
            await self._subscriptions.stop(server_id)
            for getter in (link.getter, *link.retired):
                with contextlib.suppress(Exception):
                    await getter.aclose()
        self._servers.clear()
        with contextlib.suppress(Exception):
            await self._leases.close()
        await self._close_executor()

    async def _close_executor(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        await asyncio.to_thread(executor.shutdown, wait=True)
        try:
            await asyncio.to_thread(orm.close_connections, self._thread_connections)
        except Exception:
            logger.exception("tracker %s: closing its database connections failed", self.worker_id)
        self._thread_connections.clear()

    async def _stats_loop(self, stop: asyncio.Event) -> None:
        while not await wait(stop, STATS_LOG_SECONDS):
            logger.info("tracker %s stats %s", self.worker_id, json.dumps(self.stats.as_dict()))

    async def _lost_leases_loop(self, stop: asyncio.Event) -> None:
        """A subscription moves with its task's lease: stop listening for tasks another worker now holds."""
        while not await wait(stop, self.lease.total_seconds() / 3):
            try:
                lost = await self._leases.not_held(self._subscriptions.followed_task_ids())
            except Exception:
                logger.exception("tracker %s: checking its leases failed", self.worker_id)
                continue
            if lost:
                self.lost_leases(lost)

    def lost_leases(self, owners: dict[uuid.UUID, str | None]) -> None:
        """Stop following tasks this worker no longer holds (`owners`: each one's owner now, None if it ended)."""
        moved = sum(1 for owner in owners.values() if owner is not None)
        if moved:
            logger.info(
                "tracker %s: %d task(s) it followed are held by another worker now; it stops listening for them",
                self.worker_id,
                moved,
            )
        self._subscriptions.release(set(owners))
        for task_id in owners:
            self._digests.pop(task_id, None)
            self._last_snapshots.pop(task_id, None)
            self._not_found.pop(task_id, None)

    # -- claiming ---------------------------------------------------------------------------------

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        held, poll_finished = self._pollers.held, self._pollers.poll_finished
        while not stop.is_set():
            room = min(self.batch_size, self.max_in_flight - len(held))
            if room <= 0:
                poll_finished.clear()
                await wait(stop, IDLE_CLAIM_SECONDS, poll_finished)
                continue
            try:
                claimed = await self._leases.claim(room)
            except Exception:
                logger.exception("tracker %s: claiming failed; retrying", self.worker_id)
                await wait(stop, 1.0)
                continue
            for row in claimed:
                self._start_poll(row)
            if len(claimed) < room:
                await wait(stop, IDLE_CLAIM_SECONDS)

    def _start_poll(self, claimed: Claimed) -> None:
        if claimed.task_id in self._pollers.held:
            return  # moved earlier by someone else while we poll it; the reschedule keeps the earlier time
        if claimed.previous_owner != self.worker_id:
            # It comes from another worker (or from nobody): what we remember of it may be stale.
            self._digests.pop(claimed.task_id, None)
            self._last_snapshots.pop(claimed.task_id, None)
            self._not_found.pop(claimed.task_id, None)
        self.stats.claimed += 1
        self._pollers.add(claimed)

    # -- polling ----------------------------------------------------------------------------------

    @tracing.traced("taskhub.tracker.poll", attributes=tracing.poll_attributes, new_trace=True)
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
        except ProcessElsewhere:
            self._back_off(claimed)  # a stdio server's lease moved meanwhile: not an outage; the owner polls it
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
            metrics.poll_failed(claimed.server_id, "error")
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
        last = self._last_snapshots.get(claimed.task_id)
        if last is not None and last[0] is snapshot:
            digest = last[1]  # the getter's very object: the same answer as last time (lean.LeanTaskGetter)
        else:
            digest = snapshot_digest(snapshot)
            self._last_snapshots[claimed.task_id] = (snapshot, digest)
        known = self._digests.get(claimed.task_id)
        if known is None and claimed.stored_as(snapshot):
            # The first poll since the claim, and the row already says all of it: nothing to store.
            self._digests[claimed.task_id] = digest
        elif known != digest or claimed.asks_beyond_open_requests(snapshot):
            try:
                await self._in_thread(partial(orm.apply, claimed.task_id, snapshot, asked_at))
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
        if self._subscriptions.covers(claimed):
            interval = max(10 * (interval or DEFAULT_POLL_INTERVAL_MS), SAFETY_NET_MS)
        else:
            self._want_notifications(claimed)
        delay = poll_delay_ms(interval, floor_ms=self.min_interval_ms, cap_ms=self.max_interval_ms)
        self._leases.reschedule(claimed, delay_ms=delay, failures=0)

    async def _server_trouble(self, claimed: Claimed, error: McpClientError) -> None:
        self.stats.failures += 1
        metrics.poll_failed(claimed.server_id, "unreachable")
        link = self._servers.get(claimed.server_id)
        if link is not None and link.reachable is not False:
            link.reachable = False
            await self._service(partial(orm.server_failed, claimed.server_id, str(error)), "recording an outage")
        self._back_off(claimed)

    async def _not_found_answer(self, claimed: Claimed, error: TaskNotFound) -> None:
        self.stats.failures += 1
        metrics.poll_failed(claimed.server_id, "not_found")
        await self._note_reachable(claimed.server_id)
        started_at = self.stdio.process_started_at(claimed.server_id) if self.stdio is not None else None
        if started_at is not None:
            # A stdio server's process that started after the task was sent never knew it: the task is lost.
            lost = await self._service(partial(orm.mark_lost, claimed.task_id, started_at), "marking a task lost")
            if lost:
                self._forget(claimed.task_id, claimed.server_id, claimed.remote_task_id)
                return
        if claimed.ttl_passed(datetime.now(UTC)):
            await self._give_up(claimed)
            return
        count = self._not_found[claimed.task_id] = self._not_found.get(claimed.task_id, 0) + 1
        problem = {
            "problem": "the server says it does not know this task, although its TTL has not passed",
            "source": "poll",
            "error": {"code": error.code, "message": short(error.message)},
        }
        await self._service(partial(orm.record_poll_problem, claimed.task_id, problem), "recording a protocol error")
        if count >= NOT_FOUND_GIVE_UP:
            await self._give_up(claimed)
        else:
            self._back_off(claimed)

    async def _give_up(self, claimed: Claimed) -> None:
        if await self._service(partial(orm.expire, claimed.task_id), "expiring a task") is None:
            self._back_off(claimed)
            return
        self._forget(claimed.task_id, claimed.server_id, claimed.remote_task_id)

    async def _bad_answer(self, claimed: Claimed, error: McpClientError) -> None:
        self.stats.failures += 1
        metrics.poll_failed(claimed.server_id, "protocol")
        await self._note_reachable(claimed.server_id)
        problem: dict[str, Any] = {"problem": "tasks/get answered something the protocol does not allow"}
        if isinstance(error, IncompleteAnswer):
            problem["problem"] = "the answer to tasks/get broke off or did not finish in time"
        if isinstance(error, ProtocolError):
            problem["error"] = {"code": error.code, "message": short(error.message)}
        else:
            problem["detail"] = short(str(error))
        problem["source"] = "poll"
        await self._service(partial(orm.record_poll_problem, claimed.task_id, problem), "recording a protocol error")
        self._back_off(claimed)

    def _back_off(self, claimed: Claimed) -> None:
        failures = claimed.failures + 1
        delay = backoff_delay_ms(failures, base_seconds=self.backoff_base_seconds, cap_seconds=self.backoff_cap_seconds)
        self._leases.reschedule(claimed, delay_ms=max(delay, self.min_interval_ms), failures=failures)

    def _forget(self, task_id: uuid.UUID, server_id: int, remote_task_id: str) -> None:
        self._digests.pop(task_id, None)
        self._last_snapshots.pop(task_id, None)
        self._not_found.pop(task_id, None)
        self._subscriptions.forget(task_id, server_id, remote_task_id)

    async def _note_reachable(self, server_id: int) -> None:
        link = self._servers.get(server_id)
        if link is not None and link.reachable is not True:
            link.reachable = True
            await self._service(partial(orm.server_answered, server_id), "recording a recovery")

    def _want_notifications(self, claimed: Claimed) -> None:
        """Queue a held live task for the server's next subscription, unless the server cannot listen."""
        link = self._servers.get(claimed.server_id)
        if not self.listen or link is None or self._stopping:
            return
        self._subscriptions.want(claimed, getter=link.getter, target=link.target)

    # -- servers ------------------------------------------------------------------------------------

    async def _link(self, server_id: int) -> ServerLink:
        link = self._servers.get(server_id)
        if link is not None and time.monotonic() - link.loaded_at < SERVER_REFRESH_SECONDS:
            return link
        async with self._server_lock:
            link = self._servers.get(server_id)
            if link is not None and time.monotonic() - link.loaded_at < SERVER_REFRESH_SECONDS:
                return link
            target = await self._in_thread(partial(orm.load_target, server_id))
            if link is not None and link.target == target:
                link.loaded_at = time.monotonic()
                return link
            if link is not None:
                # Its settings changed: polls in flight finish on the old getter, closed with the tracker.
                link.retired.append(link.getter)
                link.getter = self._getter(target, server_id)
                link.target, link.loaded_at = target, time.monotonic()
                return link
            link = ServerLink(
                getter=self._getter(target, server_id),
                semaphore=asyncio.Semaphore(self.per_server_concurrency),
                target=target,
                loaded_at=time.monotonic(),
            )
            self._servers[server_id] = link
            return link

    def _getter(self, target, server_id: int) -> TaskGetter:
        if isinstance(target, StdioTarget) and self.stdio is not None:
            return OwnedProcessGetter(self.stdio, server_id)
        return task_getter(target, timeout=self.request_timeout, concurrency=self.per_server_concurrency)

    # -- the ORM, off the event loop ------------------------------------------------------------------

    async def _in_thread(self, work: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, tracing.bind(orm.in_fresh_connection), work, self._thread_connections, self.stats
        )

    async def _service(self, work: Callable[[], Any], what: str) -> Any:
        """Run a service call; a failure is logged and answered with None, never raised into a poll."""
        try:
            return await self._in_thread(work)
        except Exception:
            logger.exception("tracker %s: %s failed", self.worker_id, what)
            return None
