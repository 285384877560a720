"""Where the jobs of a stdio server go (issue 13): its own queue, run only by the worker that runs its process.

The whole path in real processes is in tests/test_stdio_workers.py; here the routing rules themselves."""

import asyncio
import datetime

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob
from procrastinate.jobs import Job

from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.worker import stdio
from taskhub.worker.jobs import LAUNCH_RETRY
from taskhub.worker.stdio import NotOwner
from taskhub.worker.stdio.supervisor import StdioSupervisor
from tests.catalogue_fixtures import with_tools

pytestmark = pytest.mark.django_db


@pytest.fixture
def stdio_server():
    server = create_server(name="local tool", transport="stdio", command="local-mcp-server", user=None)
    return with_tools(server, "approval")


@pytest.fixture
def http_server():
    server = create_server(name="remote", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    return with_tools(server, "approval")


def queue_of_launch(task) -> str:
    return ProcrastinateJob.objects.get(task_name="taskhub.launch_task", args__task_id=str(task.pk)).queue_name


def test_a_launch_on_a_stdio_server_goes_to_its_own_queue(stdio_server, http_server):
    on_stdio = services.launch(server=stdio_server, tool="approval", arguments={}, user=None)
    on_http = services.launch(server=http_server, tool="approval", arguments={}, user=None)
    assert queue_of_launch(on_stdio) == f"stdio-{stdio_server.pk}"
    assert queue_of_launch(on_http) == "default"


def job_on(queue: str) -> Job:
    return Job(id=1, queue=queue, lock=None, queueing_lock=None, task_name="taskhub.launch_task", attempts=8)


def test_a_job_in_the_wrong_worker_is_moved_to_the_servers_queue_whatever_its_attempts(stdio_server):
    before = timezone.now()
    moved = LAUNCH_RETRY.get_retry_decision(exception=NotOwner(stdio_server), job=job_on("default"))
    assert moved is not None and moved.queue == f"stdio-{stdio_server.pk}"
    # Already on its queue (the lease is moving between workers): the next try waits a little.
    again = LAUNCH_RETRY.get_retry_decision(exception=NotOwner(stdio_server), job=job_on(f"stdio-{stdio_server.pk}"))
    assert again is not None and again.retry_at - before >= datetime.timedelta(seconds=1)
    assert moved.retry_at < again.retry_at and moved.retry_at <= timezone.now()  # moved at once


def test_only_the_worker_running_the_process_hands_out_its_client(stdio_server, http_server):
    async def ask() -> list:
        answers = [stdio.owned_client(stdio_server)]  # no worker on this loop: the job starts its own, as before
        supervisor = StdioSupervisor(worker_id="w1", lease_seconds=4, run_queue=lambda queue, stop: asyncio.sleep(0))
        stdio.register(supervisor)
        try:
            answers.append(stdio.owned_client(http_server))  # HTTP: any worker
            with pytest.raises(NotOwner) as refused:
                stdio.owned_client(stdio_server)  # a worker that does not run it
            answers.append(refused.value.queue)
        finally:
            stdio.unregister(supervisor)
        return answers

    assert async_to_sync(ask)() == [None, None, f"stdio-{stdio_server.pk}"]
