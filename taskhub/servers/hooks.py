"""Where the server services hand discovery to a background job, inside their transaction.

As in taskhub/tasks/hooks.py: the job is deferred by name through Django's own database connection, so its row
commits with the server's state and audit row, or not at all; taskhub/worker/jobs.py registers the job under
the name, and this package never imports the worker (DESIGN.md, "Dependency direction").
"""

import functools

from django.db import transaction
from procrastinate import exceptions, manager, tasks
from procrastinate.contrib.django import django_connector
from procrastinate.contrib.django.settings import settings as procrastinate_settings

# The name taskhub.worker.jobs.discover_server is registered under.
DISCOVERY_JOB = "taskhub.discover_server"
# procrastinate's own default: the queue of every job on an HTTP server, and of the periodic sweeps.
DEFAULT_QUEUE = "default"
STDIO_QUEUE_PREFIX = "stdio-"


def job_queue(server) -> str:
    """The queue of a job that talks to `server`. A stdio server's process lives in one worker (its lease owner,
    taskhub/worker/stdio/): its jobs go to a queue of its own, which only that worker runs."""
    if server.transport == "stdio":
        return f"{STDIO_QUEUE_PREFIX}{server.pk}"
    return DEFAULT_QUEUE


@functools.cache
def jobs_in_django_transaction() -> manager.JobManager:
    """procrastinate's job manager on Django's own connection: a job deferred through it commits with the caller's
    transaction (taskhub/tasks/hooks.py defers through it too)."""
    return manager.JobManager(django_connector.DjangoConnector(alias=procrastinate_settings.DATABASE_ALIAS))


def discovery_lock(server_id: int) -> str:
    """One discovery of a server at a time (lock), and at most one waiting (queueing lock)."""
    return f"discover:{server_id}"


def enqueue_discovery(server_id: int, *, requested_by: int | None, queue: str = DEFAULT_QUEUE) -> None:
    """The discovery job asks the server for its capabilities and tools and records them, or the failure.

    A discovery already waiting for this server answers this request too: the second one is not queued."""
    lock = discovery_lock(server_id)
    deferrer = tasks.configure_task(
        name=DISCOVERY_JOB, job_manager=jobs_in_django_transaction(), lock=lock, queueing_lock=lock, queue=queue
    )
    try:
        # A savepoint: the refused insert of a second waiting job must not break the caller's transaction.
        with transaction.atomic():
            deferrer.defer(server_id=server_id, requested_by=requested_by)
    except exceptions.AlreadyEnqueued:
        pass
