"""`python manage.py worker`: background jobs (procrastinate) and the tracker, in one process.

Any number can run at once on one database: jobs are claimed by procrastinate, tasks to poll by the
tracker's leases. SIGTERM or SIGINT finishes in-flight work, releases the leases and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection
from procrastinate.contrib.django import app

from taskhub.worker.clients import shared_clients
from taskhub.worker.slots import SLOTS
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
            help="how long a claimed task stays this worker's without renewal; a dead worker's tasks move on after it",
        )
        parser.add_argument(
            "--shutdown-timeout", type=float, default=30.0, help="seconds in-flight jobs get on stop (default 30)"
        )

    def handle(self, *args, name=None, concurrency=20, lease_seconds=30.0, shutdown_timeout=30.0, **options):
        worker_id = name or f"{socket.gethostname()}-{os.getpid()}"
        # The worker connector reads the connection parameters, which an embedded Postgres only knows once started.
        connection.ensure_connection()
        with app.replace_connector(app.connector.get_worker_connector()):
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
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    async with app.open_async(), shared_clients():
        jobs = asyncio.create_task(
            run_jobs(worker_id=worker_id, concurrency=concurrency, shutdown_timeout=shutdown_timeout, stop=stop),
            name="jobs",
        )
        tracker = asyncio.create_task(
            Tracker(
                worker_id=worker_id,
                lease_seconds=lease_seconds,
                backoff_cap_seconds=settings.TASKHUB_POLL_BACKOFF_CAP_SECONDS,
            ).run(stop),
            name="tracker",
        )
        print(f"worker {worker_id} running (jobs and tracker)", flush=True)
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({jobs, tracker, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for finished in done - {stopping}:
            if finished.exception() is not None:
                logger.error("%s stopped unexpectedly", finished.get_name(), exc_info=finished.exception())
        stop.set()
        results = await asyncio.gather(jobs, tracker, return_exceptions=True)
        stopping.cancel()
        for result in results:
            if isinstance(result, Exception):
                logger.error("worker part failed: %r", result)


# Between two starts of the job runner after it stopped on a database error: doubling, capped.
RESTART_FIRST_SECONDS = 1.0
RESTART_CAP_SECONDS = 30.0
# A job retried for later (its server's share of the slots taken, an answer waiting to settle) is not announced
# the way a new job is: the runner looks for due jobs this often when it has nothing to do (procrastinate: 5 s).
FETCH_POLL_SECONDS = 1.0


async def run_jobs(*, worker_id: str, concurrency: int, shutdown_timeout: float, stop: asyncio.Event) -> None:
    """procrastinate's job runner until `stop`, started again whenever it stops by itself.

    It stops when its database connection fails (its job fetch raises, its LISTEN connection ends it), e.g.
    on a Postgres restart; the process must not exit for that. Jobs it was running when it stopped are
    finished or, if its heartbeat ended first, retried by `retry_stalled_jobs`.
    """
    SLOTS.concurrency = concurrency  # each server's share of the slots is a part of it
    delay = RESTART_FIRST_SECONDS
    while not stop.is_set():
        runner = asyncio.create_task(
            app.run_worker_async(
                name=worker_id,
                concurrency=concurrency,
                install_signal_handlers=False,
                shutdown_graceful_timeout=shutdown_timeout,
                update_heartbeat_interval=settings.TASKHUB_WORKER_HEARTBEAT_SECONDS,
                fetch_job_polling_interval=FETCH_POLL_SECONDS,
                stalled_worker_timeout=settings.TASKHUB_STALLED_WORKER_SECONDS,
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
