"""stdio servers in the worker: one long-lived process per enabled stdio server, in the worker that holds its lease.

- `leases`: the lease on each stdio server (`servers.ServerProcess`), claimed and renewed in Postgres.
- `processes`: the process of one server, its client, its restarts with backoff, and what its page shows.
- `supervisor`: per worker, claims leases and, for each server it holds, runs the process and a procrastinate
  loop on the server's own job queue (`servers.hooks.job_queue`), so that every job on the server runs here;
  the tracker of the same worker claims the server's tasks (tracker/leases.py) and polls them through the process.

Why a queue per server: procrastinate already routes, locks, retries and recovers stalled jobs; a job on a
stdio server is deferred to its queue, which only the lease owner listens to, so nothing new has to hand work
over. A job that still lands in a worker that does not own its server (deferred before the lease moved, or on
the default queue) raises `NotOwner` before it does anything, and is retried on the server's queue.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from taskhub.mcp.errors import TransportError
from taskhub.servers.hooks import STDIO_QUEUE_PREFIX, job_queue
from taskhub.tasks.errors import LeaseLost

if TYPE_CHECKING:
    from taskhub.mcp.client import TasksClient
    from taskhub.servers.models import Server
    from taskhub.worker.stdio.supervisor import StdioSupervisor

_supervisors: dict[asyncio.AbstractEventLoop, StdioSupervisor] = {}


class NotOwner(Exception):
    """This worker does not run the stdio server's process: the job goes to the server's queue. Nothing was done."""

    def __init__(self, server: Server | None = None, *, lost: LeaseLost | None = None) -> None:
        server_id = server.pk if server is not None else lost.server_id
        super().__init__(f"server {server_id}'s process runs in another worker" + (f" ({lost})" if lost else ""))
        # `lost`: the database said this worker's lease is gone; only stdio servers have leases.
        self.queue = job_queue(server) if server is not None else f"{STDIO_QUEUE_PREFIX}{server_id}"


class ProcessElsewhere(TransportError):
    """The tracker asked for a stdio server's process in a worker that does not (or no longer) run it."""


def register(supervisor: StdioSupervisor) -> None:
    _supervisors[asyncio.get_running_loop()] = supervisor


def unregister(supervisor: StdioSupervisor) -> None:
    loop = asyncio.get_running_loop()
    if _supervisors.get(loop) is supervisor:
        del _supervisors[loop]


def current() -> StdioSupervisor | None:
    """The supervisor of the worker running on this loop; None outside a worker (a test calling a job directly)."""
    try:
        return _supervisors.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


def lease_owner(server: Server, *, supervisor: StdioSupervisor | None = None) -> str | None:
    """This worker's id, for the services to check its lease on the stdio server's process in SQL; None for an HTTP
    server or outside a worker. `supervisor`: this worker's, read on its loop by a caller that asks from a thread."""
    supervisor = supervisor or current()
    return supervisor.worker_id if server.transport == "stdio" and supervisor is not None else None


def lease_owner_of(server_id: int) -> str | None:
    """lease_owner, knowing only the server's id: this worker's id when it runs the server's stdio process."""
    supervisor = current()
    return supervisor.worker_id if supervisor is not None and supervisor.process(server_id) is not None else None


def owned_client(server: Server) -> TasksClient | None:
    """The client of the stdio server's process in this worker; None for an HTTP server, or outside a worker
    (then the caller starts a process of its own, as before). Raises NotOwner in a worker that does not own it."""
    if server.transport != "stdio":
        return None
    supervisor = current()
    if supervisor is None:
        return None
    process = supervisor.process(server.pk)
    if process is None:
        raise NotOwner(server)
    return process.client
