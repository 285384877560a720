"""`python manage.py worker`: background jobs (procrastinate) and the tracker, in one process.

Any number can run at once on one database: jobs are claimed by procrastinate, tasks to poll by the
tracker's leases. Each beats a heartbeat row and takes over the leases and jobs of a worker that stopped beating
(heartbeats.py). SIGTERM or SIGINT finishes in-flight work, releases the leases and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import OperationalError, connection
from procrastinate.contrib.django import app
from procrastinate.contrib.django.db_cleanup import close_db_connections

from taskhub.approvals.hooks import WEBHOOK_QUEUE
from taskhub.database.params import database_params
from taskhub.observability import jobs as observability_jobs
from taskhub.runtime import tune_garbage_collector
from taskhub.servers.hooks import DEFAULT_QUEUE
from taskhub.worker import health, shutdown
from taskhub.worker.clients import shared_clients
from taskhub.worker.connector import worker_connector
from taskhub.worker.heartbeats import RUNNING_AS, Heartbeat
from taskhub.worker.slots import SLOTS
from taskhub.worker.stdio.supervisor import StdioSupervisor
from taskhub.worker.tracker import Tracker

logger = logging.getLogger("taskhub.worker")


class Command(BaseCommand):
    help = "Run background jobs and follow live tasks (the tracker) until SIGTERM or SIGINT."

    def add_arguments(self, parser):
        parser.add_argument("--name", help="worker id, shown in leases and logs (default: host-pid)")
        parser.add_argument("--concurrency", type=int, default=20, help="jobs run at once (default 20)")
        parser.add_argument(
            "--lease-seconds",
            type=float,
            default=30.0,
            help="how long a claimed task stays this worker's without renewal; a dead worker's tasks move on after it,"
            " or sooner: once its heartbeat has been silent for TASKHUB_STALLED_WORKER_SECONDS",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=30.0,
            help="seconds from SIGTERM to the worker's exit, whatever its jobs and stdio processes do (default 30;"
            " in-flight jobs get all but 6 s of it)",
        )

    def handle(self, *args, name=None, concurrency=20, lease_seconds=30.0, shutdown_timeout=30.0, **options):
        worker_id = name or f"{socket.gethostname()}-{os.getpid()}"
        # The worker connector reads the connection parameters, which an embedded Postgres only knows once started.
        wait_for_database(worker_id)
        tune_garbage_collector()
        with app.replace_connector(worker_connector()):
            asyncio.run(
                run(
                    worker_id=worker_id,
                    concurrency=concurrency,
                    lease_seconds=lease_seconds,
                    shutdown_timeout=shutdown_timeout,
                )
            )
        self.stdout.write(f"worker {worker_id} stopped")


async def run(
    *,
    worker_id: str,
    concurrency: int,
    lease_seconds: float,
    shutdown_timeout: float,
    stop: asyncio.Event | None = None,
) -> None:
    """Jobs and tracker until `stop` is set; without one given, until SIGTERM or SIGINT (main thread only)."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        watchdog = shutdown.Watchdog(worker_id=worker_id, shutdown_timeout=shutdown_timeout)

        def stopping() -> None:
            stop.set()
            watchdog.start()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping)
    RUNNING_AS.set(worker_id)  # the jobs record it on the deliveries they attempt (jobs.py)
    heartbeat = Heartbeat(owner=worker_id, connection_params=sync_to_async(database_params))
    # Its row exists before it holds anything another worker may have to take over.
    if not await first_beat(heartbeat, stop=stop):
        return
    beating_stop = asyncio.Event()  # the heartbeat goes on until the jobs and the tracker have finished
    beating = asyncio.create_task(heartbeat.run(beating_stop), name="heartbeat")
    try:
        await run_parts(
            worker_id=worker_id,
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            shutdown_timeout=shutdown_timeout,
            stop=stop,
        )
    finally:
        beating_stop.set()
        await asyncio.gather(beating, return_exceptions=True)


# Between two tries to reach the database while the worker starts: doubling, capped.
START_RETRY_FIRST_SECONDS = 0.25
START_RETRY_CAP_SECONDS = 5.0


def wait_for_database(worker_id: str) -> None:
    """Return once the database answers. A worker started before Postgres is ready (a container deployment
    starting everything at once) or while it restarts waits for it instead of exiting."""
    delay = START_RETRY_FIRST_SECONDS
    while True:
        try:
            connection.ensure_connection()
            return
        except OperationalError as error:
            if delay == START_RETRY_FIRST_SECONDS:  # once, not at every try
                logger.warning("worker %s: waiting for the database (%s)", worker_id, str(error).strip())
            connection.close()
            time.sleep(delay)
            delay = min(delay * 2, START_RETRY_CAP_SECONDS)


async def first_beat(heartbeat: Heartbeat, *, stop: asyncio.Event) -> bool:
    """Beat once, trying again while the database does not answer; False when `stop` came first."""
    delay = START_RETRY_FIRST_SECONDS
    while not stop.is_set():
        try:
            await heartbeat.beat()
            return True
        except Exception as error:
            logger.warning("worker %s: first heartbeat failed (%s); retrying", heartbeat.owner, error)
            await heartbeat.aclose()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
        delay = min(delay * 2, START_RETRY_CAP_SECONDS)
    return False


async def run_parts(
    *, worker_id: str, concurrency: int, lease_seconds: float, shutdown_timeout: float, stop: asyncio.Event
) -> None:
    """Every part of the worker until `stop` (or one of them fails); then each winds down, all of it within
    `shutdown_timeout` seconds of the stop (shutdown.py)."""
    grace = shutdown.job_grace(shutdown_timeout)

    async def run_queue(queue: str, queue_stop: asyncio.Event) -> None:
        # A stdio server's jobs, on its own queue, while this worker holds the server's lease (and runs it).
        await run_jobs(
            worker_id=f"{worker_id} {queue}",
            concurrency=concurrency,
            shutdown_timeout=grace,
            stop=queue_stop,
            queues=[queue],
        )

    async with app.open_async(), shared_clients():
        jobs = asyncio.create_task(
            run_jobs(
                worker_id=worker_id,
                concurrency=concurrency,
                shutdown_timeout=grace,
                stop=stop,
                queues=[DEFAULT_QUEUE],
            ),
            name="jobs",
        )
        # Webhook deliveries on their own queue and runner: a receiver that hangs holds none of the slots above.
        webhook_jobs = asyncio.create_task(
            run_jobs(
                worker_id=f"{worker_id} webhooks",
                concurrency=settings.TASKHUB_WEBHOOK_CONCURRENCY,
                shutdown_timeout=grace,
                stop=stop,
                queues=[WEBHOOK_QUEUE],
                server_slots=False,
            ),
            name="webhook jobs",
        )
        supervisor = StdioSupervisor(worker_id=worker_id, lease_seconds=lease_seconds, run_queue=run_queue)
        stdio_stop = asyncio.Event()  # set once the tracker and the other jobs are done with the processes
        stdio_servers = asyncio.create_task(supervisor.run(stdio_stop), name="stdio servers")
        tracker = asyncio.create_task(
            Tracker(
                worker_id=worker_id,
                lease_seconds=lease_seconds,
                backoff_cap_seconds=settings.TASKHUB_POLL_BACKOFF_CAP_SECONDS,
                stdio=supervisor,
            ).run(stop),
            name="tracker",
        )
        health_file = asyncio.create_task(health.beat(stop=stop, is_well=database_answers), name="health file")
        print(f"worker {worker_id} running (jobs, stdio servers and tracker)", flush=True)
        stopping = asyncio.create_task(stop.wait())
        parts = {jobs, webhook_jobs, stdio_servers, tracker, stopping}
        done, _ = await asyncio.wait(parts, return_when=asyncio.FIRST_COMPLETED)
        stopped_at = asyncio.get_running_loop().time()
        for finished in done - {stopping}:
            if finished.exception() is not None:
                logger.error("%s stopped unexpectedly", finished.get_name(), exc_info=finished.exception())
        stop.set()
        supervisor.stop_jobs()  # the stdio queues' runners wind down beside the others (shutdown.py)
        stopping.cancel()

        async def wind_down() -> list:
            # The tracker first (its polls go through the stdio processes), then the processes.
            results = await asyncio.gather(jobs, webhook_jobs, tracker, health_file, return_exceptions=True)
            stdio_stop.set()
            return results + await asyncio.gather(stdio_servers, return_exceptions=True)

        winding = asyncio.create_task(wind_down(), name="wind down")
        await within_the_shutdown_timeout(
            winding, supervisor=supervisor, worker_id=worker_id, shutdown_timeout=shutdown_timeout, since=stopped_at
        )
        for result in winding.result() if winding.done() and not winding.cancelled() else []:
            if isinstance(result, Exception):
                logger.error("worker part failed: %r", result)


async def within_the_shutdown_timeout(
    winding: asyncio.Task, *, supervisor: StdioSupervisor, worker_id: str, shutdown_timeout: float, since: float
) -> None:
    """Wait for the wind-down until the cut (shutdown.py); then kill the stdio processes and, should that not end
    it, cancel what is left."""
    loop = asyncio.get_running_loop()
    reserve = shutdown.cut_reserve(shutdown_timeout)
    await asyncio.wait({winding}, timeout=max(0.0, since + shutdown.cut_at(shutdown_timeout) - loop.time()))
    if winding.done():
        return
    logger.warning(
        "worker %s: not stopped %.1f s after it was told to; killing the stdio processes it still holds",
        worker_id,
        loop.time() - since,
    )
    supervisor.kill_processes()
    await asyncio.wait({winding}, timeout=reserve / 2)
    if not winding.done():
        logger.error("worker %s: cancelling what is still running at its shutdown timeout", worker_id)
        winding.cancel()
        await asyncio.wait({winding}, timeout=reserve / 4)


async def database_answers() -> None:
    """The worker's health (taskhub/worker/health.py): its job connection reaches the database."""
    await app.connector.execute_query_one_async("SELECT 1 AS one")


# Between two starts of the job runner after it stopped on a database error: doubling, capped.
RESTART_FIRST_SECONDS = 1.0
RESTART_CAP_SECONDS = 30.0
# A job retried or deferred for later (its server's share of the slots taken, an answer waiting to settle, a fallback:
# migration tasks/0025) is not announced the way a job due now is: the runner looks for due jobs this often when it
# has nothing to do (procrastinate: 5 s).
FETCH_POLL_SECONDS = 1.0
# procrastinate's Django app wraps every async job in a middleware that sends close_old_connections to the ORM's
# thread before and after it: two thread hops per job, the one before its first statement 0.8 ms (p50, measured
# before answer deliveries in the approval benchmark's stack). Our async jobs reach the ORM only through jobs.db(),
# which does that check on the same thread before each call, so they run without it. A sync job would run on a
# thread of procrastinate's pool: it keeps the sync middleware.
JOB_MIDDLEWARE = [close_db_connections]


async def run_jobs(
    *,
    worker_id: str,
    concurrency: int,
    shutdown_timeout: float,
    stop: asyncio.Event,
    queues: list[str] | None = None,
    server_slots: bool = True,
) -> None:
    """procrastinate's job runner on `queues` (None: all) until `stop`, started again whenever it stops by itself;
    once stopped, running jobs get `shutdown_timeout` seconds before they are cancelled.

    It stops when its database connection fails (its job fetch raises, its LISTEN connection ends it), e.g.
    on a Postgres restart; the process must not exit for that. Jobs it was running when it stopped are
    finished or, if its heartbeat ended first, queued again by another worker's heartbeat (heartbeats.py).
    """
    if server_slots:  # not the webhooks' runner: MCP servers' jobs share the slots of the runner that runs them
        SLOTS.concurrency = concurrency  # each server's share of the slots is a part of it
    delay = RESTART_FIRST_SECONDS
    while not stop.is_set():
        runner = asyncio.create_task(
            app.run_worker_async(
                name=worker_id,
                queues=queues,
                concurrency=concurrency,
                install_signal_handlers=False,
                shutdown_graceful_timeout=shutdown_timeout,
                update_heartbeat_interval=settings.TASKHUB_WORKER_HEARTBEAT_SECONDS,
                fetch_job_polling_interval=FETCH_POLL_SECONDS,
                stalled_worker_timeout=settings.TASKHUB_STALLED_WORKER_SECONDS,
                worker_middleware=observability_jobs.worker_middleware(),
                task_middleware=JOB_MIDDLEWARE,
            ),
            name="job runner",
        )
        stopping = asyncio.create_task(stop.wait())
        started = asyncio.get_running_loop().time()
        await asyncio.wait({runner, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            runner.cancel()  # procrastinate treats this as a graceful stop: running jobs get shutdown_timeout
            await asyncio.gather(runner, return_exceptions=True)
            return
        stopping.cancel()
        error = runner.exception()
        if asyncio.get_running_loop().time() - started > RESTART_CAP_SECONDS:
            delay = RESTART_FIRST_SECONDS
        logger.error("job runner of %s stopped (%r); starting it again in %g s", worker_id, error, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
        delay = min(delay * 2, RESTART_CAP_SECONDS)
