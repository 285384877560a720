"""The poller pool: claimed rows wait in a due-time heap per server, taken in turn by a fixed pool of pollers
per server (no asyncio task, timer or callback per poll)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from taskhub.observability import metrics
from taskhub.worker.tracker.leases import Claimed


@dataclass(slots=True)
class ServerQueue:
    """This worker's claimed rows of one server, earliest due first, and the pollers that take them in turn."""

    heap: list[tuple[float, int, Claimed]] = field(default_factory=list)  # (loop time due, tie-break, row)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pollers: list[asyncio.Task] = field(default_factory=list)


class PollerPool:
    """Hand each claimed row to `poll` at its time, through its server's queue and pollers."""

    def __init__(self, *, pollers_per_server: int, poll: Callable[[Claimed], Awaitable[None]]) -> None:
        self.pollers_per_server = pollers_per_server
        # Task ids claimed and not yet rescheduled (queued or being polled): never two polls of one task at once.
        self.held: set[uuid.UUID] = set()
        self.poll_finished = asyncio.Event()
        self._poll = poll
        self._queues: dict[int, ServerQueue] = {}
        self._queue_order = itertools.count()
        self._draining = False

    def add(self, claimed: Claimed) -> None:
        self.held.add(claimed.task_id)
        queue = self._queues.get(claimed.server_id)
        if queue is None:
            queue = self._queues[claimed.server_id] = ServerQueue()
            queue.pollers = [
                asyncio.create_task(self._poller(queue), name=f"tracker-poller-{claimed.server_id}")
                for _ in range(self.pollers_per_server)
            ]
        due = asyncio.get_running_loop().time() + claimed.due_in  # claimed ahead of its time: polled at it
        heapq.heappush(queue.heap, (due, next(self._queue_order), claimed))
        queue.ready.set()

    async def drain(self) -> None:
        """Let the pollers poll every row still queued (due within the claim-ahead time), then end; wait for them."""
        self._draining = True
        for queue in self._queues.values():
            queue.ready.set()
        pollers = [poller for queue in self._queues.values() for poller in queue.pollers]
        if pollers:
            await asyncio.gather(*pollers, return_exceptions=True)

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
            metrics.poll_sent(claimed.server_id, loop.time() - due)
            try:
                await self._poll(claimed)
            finally:
                self.held.discard(claimed.task_id)
                self.poll_finished.set()
