"""The tracker's task subscriptions (`subscriptions/listen` with `taskIds`): per server, the held live tasks are
subscribed in batches; a notified snapshot is stored like a polled one, and a covered task is polled only as a
safety net. A server that cannot listen is polled.

A subscription moves with its task's lease: a task whose lease another worker took (this one was thought dead) is
dropped here (`release`), and a subscription left with none of its tasks ends; the new owner subscribes on its first
poll. A notification about a task this worker followed before (another worker holds it now, or it ended) is dropped,
logged at DEBUG only; one about a task it never followed here is logged once per subscription (a server's mistake)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from taskhub.mcp.client import TasksClient
from taskhub.mcp.errors import McpClientError, MethodNotFound, MissingCapability
from taskhub.mcp.lean import TaskGetter
from taskhub.mcp.wire import TaskSnapshot
from taskhub.observability import metrics, tracing
from taskhub.worker.tracker import orm
from taskhub.worker.tracker.leases import Claimed
from taskhub.worker.tracker.polling import TrackerStats, short, snapshot_digest

logger = logging.getLogger(__package__)

SUBSCRIBE_COALESCE_SECONDS = 0.2
# How many tasks a watch remembers it followed before (released or ended), so that their late notifications are
# dropped quietly.
FORMER_TASKS_KEPT = 10_000


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
    former: dict[str, None] = field(default_factory=dict)  # followed before, oldest first (FORMER_TASKS_KEPT at most)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task | None = None
    subscriptions: dict[asyncio.Task, list[str]] = field(default_factory=dict)  # each one and the tasks it asked


def remember_former(watch: ServerWatch, remote_task_id: str) -> None:
    watch.former.pop(remote_task_id, None)
    watch.former[remote_task_id] = None
    while len(watch.former) > FORMER_TASKS_KEPT:
        del watch.former[next(iter(watch.former))]


class Subscriptions:
    """One worker's watches, one per server it follows tasks on.

    Shares with the tracker what it remembers of each task's last stored snapshot (`digests`), how it runs a
    service call (`service`: logged, None on failure), how a task is pulled back into polling (`pull_in`) and
    the background work it awaits on stop (`background`)."""

    def __init__(
        self,
        *,
        worker_id: str,
        request_timeout: float,
        stats: TrackerStats,
        digests: dict[uuid.UUID, bytes],
        service: Callable[[Callable[[], Any], str], Awaitable[Any]],
        pull_in: Callable[[list[uuid.UUID]], Awaitable[None]],
        background: set[asyncio.Task],
    ) -> None:
        self.worker_id = worker_id
        self.request_timeout = request_timeout
        self.stats = stats
        self._digests = digests
        self._service = service
        self._pull_in = pull_in
        self._background = background
        self._watches: dict[int, ServerWatch] = {}
        self._notification_problems: dict[uuid.UUID, str] = {}  # the last one recorded, per task

    def covered_task_ids(self) -> list[uuid.UUID]:
        watches = self._watches.values()
        return [watch.wanted[remote] for watch in watches for remote in watch.covered if remote in watch.wanted]

    def followed_task_ids(self) -> list[uuid.UUID]:
        """The tasks this worker listens for or wants to: those it believes it holds the lease of."""
        return [task_id for watch in self._watches.values() for task_id in watch.wanted.values()]

    def release(self, task_ids: set[uuid.UUID]) -> None:
        """Stop following tasks this worker no longer holds: forget them, and end each subscription left with none
        of its tasks (its notifications would all be dropped)."""
        for watch in self._watches.values():
            gone = [remote for remote, task_id in watch.wanted.items() if task_id in task_ids]
            for remote in gone:
                self._notification_problems.pop(watch.wanted.pop(remote), None)
                remember_former(watch, remote)
                # Should the task come back to this worker, it is subscribed afresh.
                for ids in (watch.queued, watch.asked, watch.covered, watch.refused):
                    ids.discard(remote)
            if not gone:
                continue
            for subscription, asked in list(watch.subscriptions.items()):
                if not any(remote in watch.wanted for remote in asked):
                    subscription.cancel()

    def covers(self, claimed: Claimed) -> bool:
        watch = self._watches.get(claimed.server_id)
        return watch is not None and claimed.remote_task_id in watch.covered

    def want(self, claimed: Claimed, *, getter: TaskGetter, target: Any) -> None:
        """Queue a held live task for the server's next subscription, unless the server cannot listen."""
        watch = self._watches.get(claimed.server_id)
        if watch is None:
            watch = self._watches[claimed.server_id] = self._new_watch(getter, target)
            watch.runner = asyncio.create_task(self._watch_loop(claimed.server_id, watch), name="tracker-listen")
        remote_task_id = claimed.remote_task_id
        if watch.supported is False or any(remote_task_id in ids for ids in (watch.queued, watch.asked, watch.refused)):
            return
        watch.wanted[remote_task_id] = claimed.task_id
        watch.former.pop(remote_task_id, None)
        watch.queued.add(remote_task_id)
        watch.wake.set()

    def forget(self, task_id: uuid.UUID, server_id: int, remote_task_id: str) -> None:
        self._notification_problems.pop(task_id, None)
        watch = self._watches.get(server_id)
        if watch is not None:
            watch.wanted.pop(remote_task_id, None)
            watch.queued.discard(remote_task_id)
            watch.refused.discard(remote_task_id)
            remember_former(watch, remote_task_id)

    async def stop(self, server_id: int) -> None:
        """End the server's subscriptions, and close its listening client when it is not the server's getter."""
        watch = self._watches.pop(server_id, None)
        if watch is None:
            return
        tasks = [task for task in (watch.runner, *list(watch.subscriptions)) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if watch.owns_client:
            with contextlib.suppress(Exception):
                await watch.client.aclose()

    def _new_watch(self, getter: TaskGetter, target: Any) -> ServerWatch:
        # A stdio getter is already an SDK client (or the worker's client of the server's process), and a second
        # one would start a second server process.
        if isinstance(getter, TasksClient) or hasattr(getter, "listen"):
            return ServerWatch(client=getter, owns_client=False)  # type: ignore[arg-type]
        return ServerWatch(client=TasksClient(target, timeout=self.request_timeout), owns_client=True)

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
            watch.subscriptions[subscription] = batch
            subscription.add_done_callback(lambda done: watch.subscriptions.pop(done, None))

    async def _subscribe(self, server_id: int, watch: ServerWatch, task_ids: list[str]) -> None:
        accepted: set[str] = set()
        not_ours = 0
        try:
            async with metrics.subscription_open(server_id, watch.client.listen(task_ids)) as subscription:
                subscription.on_problem = partial(self._notification_problem, watch, server_id)
                watch.supported = True
                accepted = set(subscription.accepted_task_ids) & set(task_ids)
                watch.covered |= accepted
                watch.refused |= set(task_ids) - accepted
                async for snapshot in subscription:
                    if await self._notified(watch, snapshot):
                        continue
                    if snapshot.task_id in watch.former:
                        # Another worker holds it now (or it ended): that worker follows it.
                        logger.debug(
                            "tracker %s: dropped a task notification from server %s about %.80r, a task it no longer"
                            " follows",
                            self.worker_id,
                            server_id,
                            snapshot.task_id,
                        )
                        continue
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
        metrics.notification_problem(server_id)
        task_id = watch.wanted.get(remote_task_id) if isinstance(remote_task_id, str) else None
        if task_id is None:
            logger.info(
                "tracker %s: ignored a malformed task notification from server %s about no task it follows (%.80r): %s",
                self.worker_id,
                server_id,
                remote_task_id,
                short(problem),
            )
            return
        data = {"problem": "a task notification was not one the protocol allows", "detail": short(problem)}
        data["source"] = "notification"
        if self._notification_problems.get(task_id) == data["detail"]:
            return  # a flood of the same problem costs no database work
        self._notification_problems[task_id] = data["detail"]
        recording = asyncio.create_task(
            self._service(partial(orm.record_poll_problem, task_id, data), "recording a protocol error")
        )
        self._background.add(recording)
        recording.add_done_callback(self._background.discard)

    @tracing.traced("taskhub.tracker.notification", attributes=tracing.notification_attributes, new_trace=True)
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
                partial(orm.apply, task_id, snapshot, source="notification"), "storing a notified snapshot"
            )
            if applied is None:
                return True  # polling will bring it again
            self._digests[task_id] = digest
            self.stats.changes += 1
        if snapshot.is_terminal:
            self._digests.pop(task_id, None)
            watch.wanted.pop(snapshot.task_id, None)
            remember_former(watch, snapshot.task_id)
        return True
