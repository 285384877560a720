"""Per worker: claim the leases on stdio servers, and for each one held run its process and its job queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from taskhub.mcp.client import StdioTarget, TasksClient
from taskhub.servers.hooks import DEFAULT_QUEUE, STDIO_QUEUE_PREFIX, job_queue
from taskhub.servers.models import Server
from taskhub.worker import stdio
from taskhub.worker.slots import launch_timeout
from taskhub.worker.stdio import leases
from taskhub.worker.stdio.processes import REQUEST_TIMEOUT_SECONDS, StdioProcess
from taskhub.worker.waiting import wait

logger = logging.getLogger(__name__)

# How often a worker claims and renews at most (less with a short lease: a quarter of it).
CLAIM_EVERY_SECONDS = 2.0

QueueRunner = Callable[[str, asyncio.Event], Awaitable[None]]


@dataclass
class _Held:
    process: StdioProcess
    stop: asyncio.Event  # the process's
    jobs_stop: asyncio.Event  # its queue runner's: set first, and at once when the worker stops
    tasks: list[asyncio.Task]


def _claim(owner: str, lease: timedelta) -> dict[int, tuple[StdioTarget, float, str]]:
    close_old_connections()
    held = leases.claim(owner=owner, lease=lease)
    servers = Server.objects.filter(pk__in=held, transport="stdio", enabled=True)
    return {
        server.pk: (server.to_target(), max(REQUEST_TIMEOUT_SECONDS, launch_timeout(server)), job_queue(server))
        for server in servers
    }


def _requeue(server_id: int) -> int:
    close_old_connections()
    queue = f"{STDIO_QUEUE_PREFIX}{server_id}"
    return leases.requeue_if_no_longer_stdio(server_id=server_id, queue=queue, to=DEFAULT_QUEUE)


def _release(owner: str, server_ids: list[int] | None) -> None:
    close_old_connections()
    leases.release(owner=owner, server_ids=server_ids)


class StdioSupervisor:
    """`await supervisor.run(stop)`: until `stop`, this worker's share of the stdio servers; then it releases them."""

    def __init__(self, *, worker_id: str, lease_seconds: float, run_queue: QueueRunner) -> None:
        self.worker_id = worker_id
        self.lease = timedelta(seconds=lease_seconds)
        self.every = min(CLAIM_EVERY_SECONDS, lease_seconds / 4)
        self.run_queue = run_queue
        self._held: dict[int, _Held] = {}
        self._leaving: dict[int, asyncio.Task] = {}
        self._jobs_stopped = False

    # -- what jobs and the tracker ask -----------------------------------------------------------------------

    def process(self, server_id: int) -> StdioProcess | None:
        held = self._held.get(server_id)
        return held.process if held is not None else None

    def client(self, server_id: int) -> TasksClient:
        """The tracker's way to the process: a transport error when this worker does not (or no longer) own it."""
        process = self.process(server_id)
        if process is None:
            raise stdio.ProcessElsewhere(f"server {server_id}'s process runs in another worker")
        return process.client

    def process_started_at(self, server_id: int) -> datetime | None:
        process = self.process(server_id)
        return process.started_at if process is not None else None

    # -- the worker stopping (taskhub/worker/shutdown.py) ------------------------------------------------------

    def stop_jobs(self) -> None:
        """The worker stops: every stdio queue's runner winds down now, beside the other runners, not after them.
        The processes stay (the tracker and those jobs finish on them) and the leases are renewed until `run`'s stop;
        no server is taken up any more."""
        self._jobs_stopped = True
        for held in self._held.values():
            held.jobs_stop.set()

    def kill_processes(self) -> None:
        """Past the worker's shutdown deadline: SIGKILL to the process group of every process held."""
        for held in self._held.values():
            held.process.kill()

    # -- the loop ---------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        stdio.register(self)
        try:
            while not stop.is_set():
                try:
                    wanted = await sync_to_async(_claim)(self.worker_id, self.lease)
                except Exception:
                    logger.exception("worker %s: claiming stdio servers failed; retrying", self.worker_id)
                else:
                    await self._follow(wanted)
                await wait(stop, self.every)
        finally:
            held = list(self._held)
            await asyncio.gather(*self._leaving.values(), return_exceptions=True)
            await asyncio.gather(*(self._let_go(server_id) for server_id in held), return_exceptions=True)
            try:
                await sync_to_async(_release)(self.worker_id, None)
            except Exception:
                logger.exception("worker %s: releasing its stdio servers failed; their leases expire", self.worker_id)
            stdio.unregister(self)

    async def _follow(self, wanted: dict[int, tuple[StdioTarget, float, str]]) -> None:
        for server_id in [server_id for server_id in self._held if server_id not in wanted]:
            if server_id not in self._leaving:  # stopping its jobs may take a while: the others are not held up
                leaving = asyncio.create_task(self._give_up(server_id), name=f"stdio-let-go-{server_id}")
                self._leaving[server_id] = leaving
                leaving.add_done_callback(lambda _, server_id=server_id: self._leaving.pop(server_id, None))
        if self._jobs_stopped:  # stopping: only those held are renewed; the others are left to other workers
            let_go = [server_id for server_id in wanted if server_id not in self._held]
            if let_go:
                await sync_to_async(_release)(self.worker_id, let_go)
            return
        for server_id, (target, timeout, queue) in wanted.items():
            if server_id in self._leaving:
                continue  # held again once it is stopped (the next claim)
            held = self._held.get(server_id)
            if held is not None and held.process.target == target:
                continue
            if held is not None and held.process.target.same_process(target):  # its roots or sampling changed
                await held.process.use_target(target)
                continue
            if held is not None:  # its command, arguments or environment changed: a new process
                await self._let_go(server_id)
            self._hold(server_id, target, timeout, queue)

    def _hold(self, server_id: int, target: StdioTarget, timeout: float, queue: str) -> None:
        logger.info("worker %s: runs stdio server %s (queue %s)", self.worker_id, server_id, queue)
        process = StdioProcess(server_id=server_id, target=target, owner=self.worker_id, timeout=timeout)
        stop, jobs_stop = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(process.keep(stop), name=f"stdio-process-{server_id}"),
            asyncio.create_task(self.run_queue(queue, jobs_stop), name=f"stdio-jobs-{server_id}"),
        ]
        self._held[server_id] = _Held(process=process, stop=stop, jobs_stop=jobs_stop, tasks=tasks)

    async def _give_up(self, server_id: int) -> None:
        logger.info("worker %s: no longer runs stdio server %s", self.worker_id, server_id)
        await self._let_go(server_id)
        with contextlib.suppress(Exception):
            await sync_to_async(_release)(self.worker_id, [server_id])
        try:
            moved = await sync_to_async(_requeue)(server_id)
        except Exception:
            logger.exception("worker %s: moving the jobs of server %s failed", self.worker_id, server_id)
        else:
            if moved:
                logger.info("worker %s: %d job(s) of former stdio server %s moved", self.worker_id, moved, server_id)

    async def _let_go(self, server_id: int) -> None:
        held = self._held.get(server_id)
        if held is None:
            return
        held.jobs_stop.set()
        held.stop.set()
        # The jobs first, then the process; only then is it no longer ours.
        runner, keeper = held.tasks[1], held.tasks[0]
        await asyncio.gather(runner, return_exceptions=True)
        await asyncio.gather(keeper, return_exceptions=True)
        self._held.pop(server_id, None)
