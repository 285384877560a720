"""Each server's share of a worker's job slots, so that one slow or dead server cannot hold them all.

procrastinate runs at most `--concurrency` jobs at once in a worker. A tool that never answers held a launch's slot
for the whole launch timeout: 20 such launches held all 20 slots, and every other server's answers and launches
waited behind them (issue 14). Here each server gets a share (TASKHUB_MAX_JOBS_PER_SERVER, or a quarter of the
worker's concurrency, or the server's own `max_concurrent_jobs`): a job takes one of its server's slots before it
talks to the server and gives it back when done. A job that finds its server's share taken waits for a slot of it
briefly (SLOT_WAIT_SECONDS: the jobs of a busy but quick server just queue here); longer would hold its
procrastinate slot all the same, so then it raises `ServerBusy`, and procrastinate runs it again a moment later
(`jobs.Backoff`), with its priority, without counting the attempt (`jobs.give_back_attempt`).

The counts are per worker process (each worker has slots of its own). They are taken from the job's thread or its
event loop, hence the lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.conf import settings

from taskhub.servers.models import Server

# procrastinate's concurrency in this process when no worker said otherwise (the worker command's default).
DEFAULT_CONCURRENCY = 20
# How long a job waits for its server's slot before it gives its own job slot back; answers and cancels (a person
# waits for them, and they go ahead of launches) wait longer.
SLOT_WAIT_SECONDS = 0.5
DELIVERY_SLOT_WAIT_SECONDS = 2.0


class ServerBusy(Exception):
    """The server's share of this worker's job slots is taken; the job runs again shortly, nothing was sent."""


class ServerSlots:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: Counter[int] = Counter()
        self._waiters: defaultdict[int, list[asyncio.Future]] = defaultdict(list)
        self._limits: dict[int, int | None] = {}  # each server's max_concurrent_jobs, as this worker last read it
        self.concurrency = DEFAULT_CONCURRENCY

    def share(self, server: Server) -> int:
        """How many of this worker's jobs for `server` may run at once: at least 1, at most all of them."""
        self._limits[server.pk] = server.max_concurrent_jobs
        return self._share(server.max_concurrent_jobs)

    def _share(self, max_concurrent_jobs: int | None) -> int:
        limit = max_concurrent_jobs or settings.TASKHUB_MAX_JOBS_PER_SERVER or self.concurrency // 4
        return max(1, min(limit, self.concurrency))

    def slot(self, server: Server) -> Slot:
        return Slot(slots=self, server_id=server.pk, share=self.share(server))

    def slot_by_id(self, server_id: int) -> Slot | None:
        """A slot of a server this worker has read before (its share as it was then), without reading it now: a
        delivery takes it before the claim that also reads the server. None for a server not read yet."""
        if server_id not in self._limits:
            return None
        return Slot(slots=self, server_id=server_id, share=self._share(self._limits[server_id]))

    def taken(self, server_id: int) -> int:
        with self._lock:
            return self._taken[server_id]

    def _try_take(self, server_id: int, share: int) -> bool:
        with self._lock:
            if self._taken[server_id] >= share:
                return False
            self._taken[server_id] += 1
            return True

    def _give_back(self, server_id: int) -> None:
        with self._lock:
            self._taken[server_id] -= 1
            if self._taken[server_id] <= 0:
                del self._taken[server_id]
            waiters = self._waiters.pop(server_id, [])
        for waiter in waiters:  # each tries again; one of them gets the slot
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    async def _wait_for(self, server_id: int, share: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._try_take(server_id, share):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            waiter = loop.create_future()
            with self._lock:
                if self._taken[server_id] < share:
                    continue  # given back since the try
                self._waiters[server_id].append(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                pass
            finally:
                with self._lock:
                    if waiter in self._waiters.get(server_id, ()):
                        self._waiters[server_id].remove(waiter)
        return True


@dataclass(eq=False)
class Slot:
    """One job's claim on its server's share; `release` (in a `finally`) is safe whether it was taken or not."""

    slots: ServerSlots
    server_id: int
    share: int
    held: bool = field(default=False)

    def try_take(self) -> bool:
        if not self.held:
            self.held = self.slots._try_take(self.server_id, self.share)
        return self.held

    async def take(self, wait: float = SLOT_WAIT_SECONDS) -> None:
        """Take a slot, waiting at most `wait` seconds for one; ServerBusy when none came."""
        if not self.held:
            self.held = await self.slots._wait_for(self.server_id, self.share, wait)
        if not self.held:
            raise ServerBusy(f"server {self.server_id} has {self.share} job(s) running in this worker already")

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots._give_back(self.server_id)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


SLOTS = ServerSlots()


def launch_timeout(server: Server) -> float:
    """How long a launch waits for tools/call: the server's own timeout or the setting, within the cap."""
    seconds = server.call_timeout_seconds or settings.TASKHUB_LAUNCH_TIMEOUT_SECONDS
    return float(min(seconds, settings.TASKHUB_LAUNCH_TIMEOUT_CAP_SECONDS))
