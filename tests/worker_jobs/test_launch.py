"""The launch job (jobs.launch, launch_task): its deferral with the state, sending once, MRTR rounds, retries,
stalled-job recovery, a protocol error."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from procrastinate.contrib.django import app
from procrastinate.jobs import Job

from taskhub.audit.models import AuditEvent
from taskhub.servers.services import create_server, update_server
from taskhub.tasks import hooks, services
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskPoll, TaskStatus
from taskhub.worker import jobs, sweeps
from taskhub.worker.connector import worker_connector
from tests.helpers import free_port
from tests.stack_fixtures import run_worker_until_idle
from tests.worker_jobs.job_helpers import (
    JobContext,
    WorkerContext,
    audit,
    follow,
    jobs_of,
    launched,
    reload,
    run,
    tool_calls,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]


# --- hooks: the job row commits with the state or not at all ---------------------------------------


@pytest.mark.embedded
def test_launch_defers_its_job_in_the_same_transaction(server, operator):
    task = launched(server, operator, "quick", {"text": "hooked"})
    [job] = jobs_of("taskhub.launch_task")
    assert (job.args, job.status, job.lock) == ({"task_id": str(task.id)}, "todo", f"launch:{task.id}")


@pytest.mark.embedded
def test_a_service_that_fails_after_deferring_leaves_no_job(server, operator):
    with pytest.raises(RuntimeError), transaction.atomic():
        launched(server, operator, "quick", {"text": "rolled back"})
        assert len(jobs_of("taskhub.launch_task")) == 1  # deferred inside the transaction…
        raise RuntimeError("the service fails after deferring")
    assert jobs_of("taskhub.launch_task") == []  # …and gone with it
    assert not Task.objects.exists()


# --- launch -----------------------------------------------------------------------------------------


def test_launch_of_a_synchronous_tool_completes_the_task(server, operator, recorder):
    task = launched(server, operator, "quick", {"text": "sync-1"})
    assert run(jobs.launch)(task.id) == "ToolCompleted"
    task = reload(task)
    assert task.status == TaskStatus.COMPLETED and task.remote_task_id is None
    assert task.result["content"][0]["text"] == "echo: sync-1"
    assert audit(task) == ["task.launched", "task.launch_sent", "task.launch_answered"]
    assert len(tool_calls(recorder, "quick", "sync-1")) == 1
    assert not TaskPoll.objects.filter(task=task).exists()


def test_launch_of_a_task_tool_stores_the_remote_task_and_makes_it_due(server, operator):
    task = launched(server, operator, "progress", {"steps": 2, "step_ms": 100})
    assert run(jobs.launch)(task.id) == "TaskCreated"
    task = reload(task)
    assert task.status == TaskStatus.WORKING and task.remote_task_id
    assert TaskPoll.objects.get(task=task).next_poll_at <= timezone.now()
    sent = AuditEvent.objects.get(task_id=task.id, action="task.launch_sent")
    assert (sent.actor_label, sent.data) == ("worker", {"mrtr_round": 0})


def test_a_launch_job_that_runs_again_after_success_sends_nothing(server, operator, recorder):
    task = launched(server, operator, "quick", {"text": "twice-ok"})
    run(jobs.launch)(task.id)
    assert run(jobs.launch)(task.id) == "not launching"
    assert len(tool_calls(recorder, "quick", "twice-ok")) == 1


def test_mrtr_round_is_answered_then_the_call_is_retried_and_becomes_a_task(server, operator, approver, recorder):
    task = launched(server, operator, "mrtr")
    run(run_worker_until_idle)()
    task = reload(task)
    assert task.status == TaskStatus.INPUT_REQUIRED and task.remote_task_id is None
    name = InputRequest.objects.get(task=task)
    assert (name.key, name.mrtr_round, name.state) == ("name", 1, InputRequestState.OPEN)

    grace = {"action": "accept", "content": {"name": "Grace"}}
    services.answer_input(input_request=name, response=grace, user=approver)
    run(run_worker_until_idle)()  # deliver_answer completes the round → launch job retries tools/call

    task = reload(task)
    assert task.status in (TaskStatus.WORKING, TaskStatus.COMPLETED) and task.remote_task_id
    assert InputRequest.objects.get(pk=name.pk).state == InputRequestState.DELIVERED
    # The retry carries the round's answers: it is a delivery and runs before plain launches.
    assert [job.priority for job in jobs_of("taskhub.launch_task")] == [hooks.LAUNCH_PRIORITY, hooks.DELIVERY_PRIORITY]
    first, retry = tool_calls(recorder, "mrtr")[-2:]
    assert "inputResponses" not in first.body["params"]
    assert retry.body["params"]["inputResponses"] == {"name": grace}
    assert retry.body["params"]["requestState"] == first.messages[0]["result"]["requestState"]
    assert audit(task) == [
        "task.launched",
        "task.launch_sent",
        "task.launch_answered",
        "task.input_requested",
        "input.answered",
        "task.launch_retry_scheduled",
        "task.launch_sent",
        "task.launch_answered",
        "input.delivered",
    ]
    task = follow(task, lambda t: t.is_terminal)
    assert task.result["content"][0]["text"] == "hello, Grace"


def test_a_launch_against_a_stopped_server_is_retried_then_fails_as_never_sent(operator, monkeypatch):
    # The retry a minute away, not a second: on a loaded machine the worker below was still running when a
    # second's retry fell due, and ran it (CI at b812482: attempts 2).
    monkeypatch.setattr(jobs, "LAUNCH_RETRY", dataclasses.replace(jobs.LAUNCH_RETRY, first_seconds=60.0))
    nowhere = create_server(name="down", transport="http", url=f"http://127.0.0.1:{free_port()}/mcp", user=None)
    task = launched(nowhere, operator, "quick", {"text": "nobody home"})

    with pytest.raises(jobs.ServerUnreachable):
        run(jobs.launch)(task.id, last_attempt=False)
    assert reload(task).status == TaskStatus.LAUNCHING
    assert "task.launch_sent" not in audit(task)  # nothing was sent, so a retry may send

    run(run_worker_until_idle)()
    [job] = jobs_of("taskhub.launch_task")
    assert (job.status, job.attempts) == ("todo", 1) and job.scheduled_at > timezone.now() + timedelta(seconds=30)

    assert run(jobs.launch)(task.id, last_attempt=True) == "not sent"
    task = reload(task)
    assert task.status == TaskStatus.FAILED and task.finished_at
    assert task.error["message"].startswith("The tool call was not sent:")
    failed = AuditEvent.objects.get(task_id=task.id, action="task.launch_failed")
    assert failed.data["sent"] is False


def test_a_launch_job_stopped_on_its_last_attempt_ends_the_task_instead_of_leaving_it_launching(operator):
    # The server takes the connection and never answers: the job is still waiting for it when its worker stops.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.settimeout(30)
        port = silent.getsockname()[1]
        mute = create_server(name="mute", transport="http", url=f"http://127.0.0.1:{port}/mcp", user=None)
        task = launched(mute, operator, "quick", {"text": "never answered"})

        async def stopped_mid_attempt(attempts: int) -> None:
            job = Job(id=1, queue="default", lock=None, queueing_lock=None, task_name="t", attempts=attempts)
            running = asyncio.ensure_future(jobs.launch_task.func(JobContext(job), task_id=str(task.id)))
            connection, _ = await asyncio.to_thread(silent.accept)
            with connection:
                assert await asyncio.to_thread(connection.recv, 1)  # the job's request is on its way: mid-attempt
                running.cancel()  # what a worker stopping past its grace time does to its jobs
                with pytest.raises(asyncio.CancelledError):
                    await running

        run(stopped_mid_attempt)(0)  # procrastinate retries it
        assert reload(task).status == TaskStatus.LAUNCHING
        assert audit(task) == ["task.launched"]

        run(stopped_mid_attempt)(jobs.LAUNCH_RETRY.max_attempts)  # nothing retries it
    task = reload(task)
    assert task.status == TaskStatus.FAILED and task.finished_at
    assert task.error["message"].startswith(f"Gave up after {jobs.LAUNCH_RETRY.max_attempts + 1} attempts")
    assert "not sent" in task.error["message"]
    assert audit(task) == ["task.launched", "task.launch_failed"]
    assert AuditEvent.objects.get(task_id=task.id, action="task.launch_failed").data["sent"] is False


def test_a_launch_job_sends_nothing_to_a_server_disabled_since_it_was_queued(server, operator, recorder):
    task = launched(server, operator, "quick", {"text": "disabled meanwhile"})
    update_server(server=server, user=None, enabled=False)

    assert run(jobs.launch)(task.id) == "server disabled"
    task = reload(task)
    assert task.status == TaskStatus.FAILED and "disabled" in task.error["message"]
    assert tool_calls(recorder, "quick", "disabled meanwhile") == []
    assert AuditEvent.objects.get(task_id=task.id, action="task.launch_failed").data["sent"] is False


def test_a_crash_between_send_and_answer_leaves_the_launch_unknown_and_never_resends(server, operator, recorder):
    task = launched(server, operator, "quick", {"text": "crashed"})
    assert services.mark_launch_sent(task=task) is not None  # the worker got this far, sent, and died

    assert run(jobs.launch)(task.id) == "outcome unknown"
    task = reload(task)
    assert task.status == TaskStatus.LAUNCH_UNKNOWN
    assert "never recorded" in task.status_message
    assert run(jobs.launch)(task.id) == "not launching"
    assert tool_calls(recorder, "quick", "crashed") == []
    assert audit(task) == ["task.launched", "task.launch_sent", "task.launch_unknown"]


@pytest.mark.embedded
def test_a_stalled_launch_job_is_recovered_and_reports_unknown_instead_of_resending(server, operator, recorder):
    task = launched(server, operator, "quick", {"text": "stalled"})

    async def a_worker_takes_the_job_and_dies():
        with app.replace_connector(worker_connector()) as worker_app:
            async with worker_app.open_async():
                manager = worker_app.job_manager
                worker_id = await manager.register_worker()
                job = await manager.fetch_job(queues=None, worker_id=worker_id)
                assert job.task_name == "taskhub.launch_task"
                return worker_id

    worker_id = run(a_worker_takes_the_job_and_dies)()
    services.mark_launch_sent(task=task)  # …right after marking the call sent: it may have left
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 hour' WHERE id = %s", [worker_id]
        )
    [job] = jobs_of("taskhub.launch_task")
    assert job.status == "doing"

    async def recover():
        with app.replace_connector(worker_connector()) as worker_app:
            async with worker_app.open_async():
                return await sweeps.retry_stalled_jobs.func(WorkerContext(worker_app), timestamp=0)

    assert run(recover)() == 1
    run(run_worker_until_idle)()
    assert reload(task).status == TaskStatus.LAUNCH_UNKNOWN
    assert tool_calls(recorder, "quick", "stalled") == []


def test_a_protocol_error_answer_fails_the_task_with_that_error(server, operator, approver):
    task = launched(server, operator, "mrtr")
    run(jobs.launch)(task.id)
    # The demo server seals requestState per process (as after its restart): the retry gets -32602.
    Task.objects.filter(pk=task.pk).update(mrtr_request_state="v1.not-the-state-the-server-sealed")
    name = InputRequest.objects.get(task=task)
    services.answer_input(input_request=name, response={"action": "accept", "content": {"name": "Ada"}}, user=approver)
    run(run_worker_until_idle)()

    task = reload(task)
    assert task.status == TaskStatus.FAILED and task.finished_at
    assert task.error["code"] == -32602 and task.error["message"]
    assert AuditEvent.objects.get(task_id=task.id, action="task.launch_failed").data["sent"] is True
    assert InputRequest.objects.get(pk=name.pk).state == InputRequestState.ANSWERED  # never acknowledged
