"""What the worker job tests share: launching and following tasks through the services, reading the audit, the
jobs and the demo server's counts, workers' heartbeats, and a procrastinate worker on a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
from collections.abc import Iterator

import httpx2
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.utils import timezone
from procrastinate.contrib.django import app
from procrastinate.contrib.django.models import ProcrastinateJob
from procrastinate.jobs import Job

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated, TasksClient
from taskhub.mcp.wire import TaskSnapshot
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, Task, TaskStatus
from taskhub.worker import heartbeats, jobs
from taskhub.worker.connector import worker_connector
from taskhub.worker.models import WorkerHeartbeat
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.wire_recorder import WireRecorder

run = async_to_sync


def launched(server, operator, tool: str, arguments: dict | None = None) -> Task:
    return services.launch(server=with_tools(server, tool), tool=tool, arguments=arguments or {}, user=operator)


def reload(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def audit(task: Task) -> list[str]:
    return list(AuditEvent.objects.filter(task_id=task.id).order_by("id").values_list("action", flat=True))


def jobs_of(task_name: str) -> list[ProcrastinateJob]:
    return list(ProcrastinateJob.objects.filter(task_name=task_name).order_by("id"))


def tool_calls(recorder: WireRecorder, tool: str, marker: str | None = None) -> list:
    calls = [e for e in recorder.requests("tools/call") if e.body["params"]["name"] == tool]
    return [e for e in calls if marker is None or marker in str(e.body["params"].get("arguments"))]


def demo_stats(demo: DemoServer) -> dict:
    return httpx2.get(f"http://127.0.0.1:{demo.port}/demo/stats").json()


def follow(task: Task, until, timeout: float = 15) -> Task:
    """Play the tracker: poll with tasks/get and apply each snapshot through the service until `until(task)`."""

    target = task.server.to_target()

    async def poll(remote_task_id: str) -> TaskSnapshot:
        async with TasksClient(target, timeout=10) as client:
            return await client.get_task(remote_task_id)

    deadline = timezone.now() + datetime.timedelta(seconds=timeout)
    while timezone.now() < deadline:
        task = reload(task)
        if until(task):
            return task
        services.apply_snapshot(task=task, snapshot=run(poll)(task.remote_task_id))
        time.sleep(0.1)
    raise AssertionError(f"task {task.id} stayed {task.status}")


class WorkerContext:
    def __init__(self, app):
        self.app = app


class JobContext:
    def __init__(self, job: Job):
        self.job = job


def approval_waiting(server, operator) -> Task:
    task = launched(server, operator, "approval", {"action": "ship"})
    run(jobs.launch)(task.id)
    return follow(task, lambda t: t.status == TaskStatus.INPUT_REQUIRED)


def beat(owner: str, *, seconds_ago: float = 0.0, taken_over_seconds_ago: float | None = None) -> None:
    """`owner`'s heartbeat row: its last beat, and when another worker found it dead (None: not found dead)."""
    now = timezone.now()
    at = now - datetime.timedelta(seconds=seconds_ago)
    taken_over_at = None if taken_over_seconds_ago is None else now - datetime.timedelta(seconds=taken_over_seconds_ago)
    WorkerHeartbeat.objects.update_or_create(
        owner=owner, defaults={"started_at": at, "beat_at": at, "taken_over_at": taken_over_at}
    )


def as_worker(owner: str, job):
    """`job`, run as if in the `manage.py worker` named `owner` (the name its deliveries record and are fenced by)."""

    async def in_worker(*args, **kwargs):
        # Reset after: async_to_sync copies the context back into the test's thread, and the next tests run there.
        running_as = heartbeats.RUNNING_AS.set(owner)
        try:
            return await job(*args, **kwargs)
        finally:
            heartbeats.RUNNING_AS.reset(running_as)

    return in_worker


def answered_approval(server, operator, approver) -> InputRequest:
    task = approval_waiting(server, operator)
    request = InputRequest.objects.get(task=task, key="approve")
    services.answer_input(input_request=request, response=APPROVE_ANSWER, user=approver)
    return InputRequest.objects.select_related("task__server").get(pk=request.pk)


APPROVE_ANSWER = {"action": "accept", "content": {"approved": True, "reason": "ok"}}


def live_task(server, operator, *, created_at: str, ttl_ms: int | None, remote_id: str) -> Task:
    task = launched(server, operator, "long")
    snapshot = {
        "taskId": remote_id,
        "status": "working",
        "createdAt": created_at,
        "lastUpdatedAt": created_at,
        "ttlMs": ttl_ms,
    }
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=TaskSnapshot.model_validate(snapshot)))


@contextlib.contextmanager
def worker_in_thread(*, concurrency: int, **options) -> Iterator[None]:
    """A procrastinate worker running until the block ends, on a thread and loop of its own (as `manage.py worker`
    runs its jobs: notified of new jobs, its connector its own); its jobs still running at the end are cancelled."""
    started = threading.Event()
    state: dict = {}

    async def main() -> None:
        state["loop"], state["stop"] = asyncio.get_running_loop(), asyncio.Event()
        with app.replace_connector(worker_connector()) as worker_app:
            async with worker_app.open_async():
                runner = asyncio.create_task(
                    worker_app.run_worker_async(
                        concurrency=concurrency, install_signal_handlers=False, shutdown_graceful_timeout=1, **options
                    )
                )
                started.set()
                await state["stop"].wait()
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
        # The jobs' database thread keeps its connection: close it, or the test database cannot be dropped.
        await sync_to_async(lambda: connection.close())()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="fairness worker", daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(20)
        assert not thread.is_alive()
