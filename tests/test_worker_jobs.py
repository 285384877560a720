"""Background jobs against the real demo server over HTTP: launch, answer delivery, cancel delivery, sweeps.

The jobs run directly (their async functions, on a loop of their own as in the worker) or in a
procrastinate worker run in-process until the queue is empty. A recording proxy in front of the demo
server counts what really went over the wire; `/demo/stats` counts deliveries and cancels per task.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import httpx2
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from procrastinate.contrib.django import app
from procrastinate.contrib.django.models import ProcrastinateJob
from procrastinate.jobs import Job

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import HttpTarget, TaskCreated, TasksClient, ToolInputRequired
from taskhub.mcp.errors import ProtocolError, TransportError
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.models import Server
from taskhub.servers.services import create_server, update_server
from taskhub.tasks import hooks, services
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskPoll, TaskStatus
from taskhub.worker import clients, heartbeats, jobs, slots, sweeps
from taskhub.worker.connector import worker_connector
from taskhub.worker.models import WorkerHeartbeat
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.helpers import free_port, wait_until
from tests.hostile_fixtures import register
from tests.hostile_server import HostileServer, Silence
from tests.stack_fixtures import due_jobs, run_worker_until_idle
from tests.wire_recorder import WireRecorder

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]

run = async_to_sync


@pytest.fixture(scope="module")
def demo(shared_demo_server):
    return shared_demo_server


@pytest.fixture(scope="module")
def recorder(demo):
    proxy = WireRecorder(demo.url).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def server(recorder):
    return create_server(name="demo", transport="http", url=recorder.url, user=None)


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("olga")


@pytest.fixture
def approver(django_user_model):
    return django_user_model.objects.create_user("abe")


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


def test_a_launch_against_a_stopped_server_is_retried_then_fails_as_never_sent(operator):
    nowhere = create_server(name="down", transport="http", url=f"http://127.0.0.1:{free_port()}/mcp", user=None)
    task = launched(nowhere, operator, "quick", {"text": "nobody home"})

    with pytest.raises(jobs.ServerUnreachable):
        run(jobs.launch)(task.id, last_attempt=False)
    assert reload(task).status == TaskStatus.LAUNCHING
    assert "task.launch_sent" not in audit(task)  # nothing was sent, so a retry may send

    run(run_worker_until_idle)()
    [job] = jobs_of("taskhub.launch_task")
    assert (job.status, job.attempts) == ("todo", 1) and job.scheduled_at > timezone.now()

    assert run(jobs.launch)(task.id, last_attempt=True) == "not sent"
    task = reload(task)
    assert task.status == TaskStatus.FAILED and task.finished_at
    assert task.error["message"].startswith("The tool call was not sent:")
    failed = AuditEvent.objects.get(task_id=task.id, action="task.launch_failed")
    assert failed.data["sent"] is False


def test_a_launch_job_stopped_on_its_last_attempt_ends_the_task_instead_of_leaving_it_launching(operator):
    # The server takes the connection and never answers: the job is still waiting for it when its worker stops.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        mute = create_server(name="mute", transport="http", url=f"http://127.0.0.1:{port}/mcp", user=None)
        task = launched(mute, operator, "quick", {"text": "never answered"})

        async def stopped_mid_attempt(attempts: int) -> None:
            job = Job(id=1, queue="default", lock=None, queueing_lock=None, task_name="t", attempts=attempts)
            running = asyncio.ensure_future(jobs.launch_task.func(_JobContext(job), task_id=str(task.id)))
            await asyncio.sleep(0.5)
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
                return await sweeps.retry_stalled_jobs.func(_Context(worker_app), timestamp=0)

    assert run(recover)() == 1
    run(run_worker_until_idle)()
    assert reload(task).status == TaskStatus.LAUNCH_UNKNOWN
    assert tool_calls(recorder, "quick", "stalled") == []


class _Context:
    def __init__(self, app):
        self.app = app


class _JobContext:
    def __init__(self, job: Job):
        self.job = job


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


# --- answer delivery --------------------------------------------------------------------------------


def approval_waiting(server, operator) -> Task:
    task = launched(server, operator, "approval", {"action": "ship"})
    run(jobs.launch)(task.id)
    return follow(task, lambda t: t.status == TaskStatus.INPUT_REQUIRED)


def test_an_answer_is_delivered_once_per_key_even_when_the_job_runs_twice(server, operator, approver, demo):
    task = approval_waiting(server, operator)
    approve = InputRequest.objects.get(task=task, key="approve")
    answer = {"action": "accept", "content": {"approved": True, "reason": "looks good"}}
    services.answer_input(input_request=approve, response=answer, user=approver)
    [job] = jobs_of("taskhub.deliver_answer")
    assert job.args == {"input_request_id": approve.pk, "server_id": server.pk} and job.lock == f"answer:{approve.pk}"
    TaskPoll.objects.filter(task=task).update(next_poll_at=timezone.now() + datetime.timedelta(hours=1))

    assert run(jobs.deliver)(approve.pk) == "delivered"
    assert run(jobs.deliver)(approve.pk) == "nothing to deliver"
    run(run_worker_until_idle)()  # the deferred job too: still nothing more goes out

    assert demo_stats(demo)["deliveries"][f"{task.remote_task_id}/approve"] == 1
    approve.refresh_from_db()
    assert approve.state == InputRequestState.DELIVERED and approve.delivered_at
    assert audit(task).count("input.delivered") == 1
    assert TaskPoll.objects.get(task=task).next_poll_at <= timezone.now()  # the tracker polls it at once
    task = follow(task, lambda t: t.is_terminal)
    assert task.result["content"][0]["text"] == "approved: ship (reason: looks good)"


def test_an_interrupted_delivery_is_confirmed_at_once_if_received_and_never_resent_before_it_settles(
    server, operator, approver, demo
):
    """A worker claimed two answers and died: it had sent the first, not the second. Its recovered jobs ask the server
    at once: the first is recorded as received without waiting for the attempt to settle; the second may still be
    in a request the server holds, so it is not sent before then."""
    sent, cut_off = approval_waiting(server, operator), approval_waiting(server, operator)
    answer = {"action": "accept", "content": {"approved": True, "reason": "ok"}}
    requests = {}
    for task in (sent, cut_off):
        request = InputRequest.objects.get(task=task, key="approve")
        services.answer_input(input_request=request, response=answer, user=approver)
        request.refresh_from_db()
        assert services.claim_delivery(input_request=request)  # the dead worker's claim
        requests[task.pk] = request

    async def the_dead_worker_sends(target, remote_task_id: str, response: dict) -> None:
        async with TasksClient(target) as client:
            await client.update_task(remote_task_id, {"approve": response})

    run(the_dead_worker_sends)(server.to_target(), sent.remote_task_id, requests[sent.pk].answer)

    assert run(jobs.deliver)(requests[sent.pk].pk, last_attempt=False) == "already received"
    with pytest.raises(jobs.NotBefore) as settling:
        run(jobs.deliver)(requests[cut_off.pk].pk, last_attempt=False)
    attempted = InputRequest.objects.get(pk=requests[cut_off.pk].pk).delivery_attempted_at
    assert settling.value.retry_at == attempted + datetime.timedelta(seconds=jobs.DELIVERY_SETTLE_SECONDS)

    deliveries = demo_stats(demo)["deliveries"]
    assert deliveries[f"{sent.remote_task_id}/approve"] == 1
    assert f"{cut_off.remote_task_id}/approve" not in deliveries
    assert InputRequest.objects.get(pk=requests[sent.pk].pk).state == InputRequestState.DELIVERED
    assert InputRequest.objects.get(pk=requests[cut_off.pk].pk).state == InputRequestState.ANSWERED
    delivered = AuditEvent.objects.get(task_id=sent.pk, action="input.delivered")
    assert delivered.data["confirmed_by"] == jobs.CONFIRMED_AFTER_INTERRUPTION


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


def test_a_dead_workers_cut_off_deliveries_settle_a_grace_after_its_death_was_found(server, operator, approver, demo):
    """The worker `doomed` claimed two answers and was killed: it had sent the first, not the second. Once another
    worker found it dead, its attempts settle after the short grace, not the long settle time: the first is confirmed
    received (not sent again), the second sent, once, by the job's next run."""
    sent, cut_off = (answered_approval(server, operator, approver) for _ in range(2))
    beat("doomed")
    for request in (sent, cut_off):
        assert jobs._claim(request, owner="doomed")
    assert InputRequest.objects.get(pk=cut_off.pk).delivery_attempted_by == "doomed"

    async def the_doomed_worker_sends(target, remote_task_id: str) -> None:
        async with TasksClient(target) as client:
            await client.update_task(remote_task_id, {"approve": APPROVE_ANSWER})

    run(the_doomed_worker_sends)(server.to_target(), sent.task.remote_task_id)
    beat("rescuer", seconds_ago=-60)  # a row a minute ahead: the beats a live worker makes meanwhile
    beat("doomed", seconds_ago=7, taken_over_seconds_ago=0)  # found dead just now
    started = time.monotonic()
    assert run(as_worker("rescuer", jobs.deliver))(sent.pk, last_attempt=False) == "already received"
    assert run(as_worker("rescuer", jobs.deliver))(cut_off.pk, last_attempt=False) == "delivered"
    took = time.monotonic() - started

    assert jobs.DEAD_WORKER_GRACE_SECONDS - 0.5 <= took < jobs.DEAD_WORKER_GRACE_SECONDS + 5, took
    assert took < jobs.DELIVERY_SETTLE_SECONDS - 3, took
    deliveries = demo_stats(demo)["deliveries"]
    assert (
        deliveries[f"{sent.task.remote_task_id}/approve"] == deliveries[f"{cut_off.task.remote_task_id}/approve"] == 1
    )
    cut_off.refresh_from_db()
    assert cut_off.state == InputRequestState.DELIVERED and cut_off.delivery_attempted_by == "rescuer"
    confirmed = AuditEvent.objects.get(task_id=sent.task_id, action="input.delivered")
    assert confirmed.data["confirmed_by"] == jobs.CONFIRMED_AFTER_INTERRUPTION


def test_a_paused_worker_never_sends_an_answer_once_its_delivery_was_taken_over(server, operator, approver, demo):
    """The worker `sleeper` claimed an answer and froze before sending it. While it is alive, another job leaves the
    answer to it (the long settle); a beat late, it may not send itself; found dead, its delivery is taken over and
    sent by `rescuer`; woken up afterwards (beating again), it sends nothing: its claim is no longer there."""
    request = answered_approval(server, operator, approver)
    beat("sleeper")
    beat("rescuer", seconds_ago=-60)  # a row a minute ahead: the beats a live worker makes meanwhile
    assert jobs._claim(request, owner="sleeper")
    attempted_at = request.delivery_attempted_at

    with pytest.raises(jobs.NotBefore) as left_to_it:
        run(as_worker("rescuer", jobs.deliver))(request.pk, last_attempt=False)
    assert left_to_it.value.retry_at == attempted_at + datetime.timedelta(seconds=jobs.DELIVERY_SETTLE_SECONDS)

    async def the_sleeper_wakes_and_sends() -> None:
        # Its job resumes where it froze, just before tasks/update, a minute after its claim.
        async with clients.job_client(server.to_target(), timeout=5) as client:
            paused_since = jobs.claim_clock() - 60
            await jobs._send_answer(client, request, claimed_at=paused_since, owner="sleeper")

    beat("sleeper", seconds_ago=heartbeats.FRESH_BEAT.total_seconds() + 1)  # late, not dead yet
    with pytest.raises(jobs.NotBefore) as late:
        run(the_sleeper_wakes_and_sends)()
    assert late.value.retry_at <= timezone.now() + heartbeats.FRESH_BEAT

    beat("sleeper", seconds_ago=8, taken_over_seconds_ago=jobs.DEAD_WORKER_GRACE_SECONDS)
    assert run(as_worker("rescuer", jobs.deliver))(request.pk, last_attempt=False) == "delivered"
    beat("sleeper")  # it wakes and beats again: alive, and free to claim, but its claim was taken over
    with pytest.raises(jobs.NotBefore):
        run(the_sleeper_wakes_and_sends)()

    assert demo_stats(demo)["deliveries"][f"{request.task.remote_task_id}/approve"] == 1
    request.refresh_from_db()
    assert request.state == InputRequestState.DELIVERED and request.delivery_attempted_by == "rescuer"


def test_a_claim_grown_old_before_sending_is_renewed_then_sent(server, operator, approver, demo):
    """Connecting took longer than a claim holds (the worker beats on): it claims again, and sends."""
    request = answered_approval(server, operator, approver)
    beat("slow", seconds_ago=-60)  # a row a minute ahead: the beats a live worker makes meanwhile
    assert jobs._claim(request, owner="slow")
    first_claim = request.delivery_attempted_at

    async def send_long_after_the_claim() -> None:
        async with clients.job_client(server.to_target(), timeout=5) as client:
            claimed_at = jobs.claim_clock() - heartbeats.CLAIM_HOLDS_SECONDS - 1
            await jobs._send_answer(client, request, claimed_at=claimed_at, owner="slow")

    run(send_long_after_the_claim)()
    assert demo_stats(demo)["deliveries"][f"{request.task.remote_task_id}/approve"] == 1
    renewed = InputRequest.objects.get(pk=request.pk)
    assert renewed.delivery_attempted_at > first_claim and renewed.delivery_attempted_by == "slow"


def test_a_first_delivery_claims_and_reads_its_answer_in_one_statement_on_the_worker_pool(
    server, operator, approver, demo
):
    """The job carries its server's id: with that server's share known in this worker (its launches read it), the
    slot is taken first and the claim is the one statement that also reads the answer, its task and its server, sent
    from the event loop on the worker's own pool: nothing on Django's connection (and no trip to its thread)."""
    request, not_beating = answered_approval(server, operator, approver), answered_approval(server, operator, approver)
    slots.SLOTS.share(server)
    beat("quick", seconds_ago=-60)
    heartbeats.beating_sql("quick")  # compiled once per owner (the ORM may ask the database its version)

    async def load(input_request_id: int, owner: str):
        with app.replace_connector(worker_connector()) as worker_app:
            async with worker_app.open_async():
                return await jobs._answer_to_load(input_request_id, owner=owner, server_id=server.pk)

    with CaptureQueriesContext(connection) as queries:
        loaded, claimed, slot = run(load)(request.pk, "quick")
    slot.release()
    assert claimed and queries.captured_queries == []
    assert (loaded.key, loaded.answer, loaded.delivery_attempted_by) == ("approve", APPROVE_ANSWER, "quick")
    assert loaded.task.remote_task_id == request.task.remote_task_id
    assert loaded.task.server.to_target().url == server.to_target().url and loaded.task.server.name == "demo"
    assert loaded.task.server.to_target().headers == server.to_target().headers  # the encrypted fields, decrypted
    assert InputRequest.objects.get(pk=request.pk).delivery_attempted_at == loaded.delivery_attempted_at
    assert loaded.delivery_attempted_at.utcoffset() == datetime.timedelta(0)  # read as Django reads it: in UTC

    # Claimed already, it is no first send: read, and left to the job's checks, as a job without the server's id is.
    with CaptureQueriesContext(connection) as queries:
        again, claimed_again, slot = run(load)(request.pk, "quick")
    assert not claimed_again and not slot.held and again.delivery_attempted_at == loaded.delivery_attempted_at
    assert [query["sql"].split()[0] for query in queries.captured_queries] == ["SELECT"]
    # A worker whose beat is late claims nothing this way either.
    beat("late", seconds_ago=heartbeats.FRESH_BEAT.total_seconds() + 1)
    _, claimed_late, slot = run(load)(not_beating.pk, "late")
    slot.release()
    assert not claimed_late
    assert InputRequest.objects.get(pk=not_beating.pk).delivery_attempted_at is None
    assert run(as_worker("quick", jobs.deliver))(not_beating.pk, server_id=server.pk) == "delivered"
    assert demo_stats(demo)["deliveries"][f"{not_beating.task.remote_task_id}/approve"] == 1


def test_deliveries_in_one_worker_share_one_connected_client(server, operator, approver, demo, recorder):
    tasks = [approval_waiting(server, operator) for _ in range(3)]
    requests = [InputRequest.objects.get(task=task, key="approve") for task in tasks]
    for input_request in requests:
        services.answer_input(input_request=input_request, response={"action": "decline"}, user=approver)
    discovered = len(recorder.requests("server/discover"))

    async def deliver_in_a_worker() -> list[str]:
        async with clients.shared_clients():
            first = await jobs.deliver(requests[0].pk)
            return [first, *await asyncio.gather(*(jobs.deliver(ir.pk) for ir in requests[1:]))]

    assert run(deliver_in_a_worker)() == ["delivered"] * 3
    # One connection (one discovery) for all three, the two concurrent ones included; a job of its own each before.
    assert len(recorder.requests("server/discover")) - discovered == 1
    stats = demo_stats(demo)["deliveries"]
    assert [stats[f"{task.remote_task_id}/approve"] for task in tasks] == [1, 1, 1]


def test_a_kept_client_is_per_credentials_and_connects_again_after_a_server_restart():
    async def scenario(demo: DemoServer) -> None:
        async with clients.shared_clients() as pool:
            async with pool.client(demo.target, timeout=5) as first:
                await first.request(lambda tasks: tasks.discover())
            async with pool.client(demo.target, timeout=5) as again:
                assert again.client is first.client and again.reused
            other_token = HttpTarget(url=demo.url, bearer_token="changed")
            async with pool.client(other_token, timeout=5) as other:
                assert other.client is not first.client and not other.reused
            demo.stop()
            async with pool.client(demo.target, timeout=5) as down:
                with pytest.raises(TransportError):
                    await down.request(lambda tasks: tasks.discover())
            await asyncio.to_thread(demo.start)
            async with pool.client(demo.target, timeout=5) as back:
                assert back.client is first.client
                assert (await back.request(lambda tasks: tasks.discover())).supports_tasks

    with DemoServer() as demo:
        run(scenario)(demo)


def test_a_refusal_on_a_kept_client_is_asked_once_more_on_a_new_connection(recorder):
    target = HttpTarget(url=recorder.url)

    async def scenario() -> None:
        async with clients.shared_clients() as pool:
            async with pool.client(target, timeout=5) as first:
                await first.request(lambda tasks: tasks.discover())
            sent = len(recorder.requests("tasks/get"))
            async with pool.client(target, timeout=5) as kept:
                with pytest.raises(ProtocolError):
                    await kept.request(lambda tasks: tasks.get_task(f"ghost-{uuid.uuid4()}"))
            assert len(recorder.requests("tasks/get")) - sent == 2
            async with pool.client(target, timeout=5) as after:
                assert after.client is not first.client  # the refused one is no longer handed out

    run(scenario)()


def test_delivery_to_a_task_the_server_does_not_know_is_recorded_and_not_retried(server, operator, approver):
    task = launched(server, operator, "approval")
    ghost = {
        "taskId": f"ghost-{uuid.uuid4()}",
        "status": "input_required",
        "createdAt": "2026-07-28T10:00:00Z",
        "lastUpdatedAt": "2026-07-28T10:00:00Z",
        "ttlMs": 60000,
        "inputRequests": {"ok": {"method": "elicitation/create", "params": {"message": "OK?", "requestedSchema": {}}}},
    }
    services.record_launch_outcome(task=task, outcome=TaskCreated(task=TaskSnapshot.model_validate(ghost)))
    ok = InputRequest.objects.get(task=task, key="ok")
    services.answer_input(input_request=ok, response={"action": "accept"}, user=approver)

    assert run(jobs.deliver)(ok.pk, last_attempt=False) == "refused"
    ok.refresh_from_db()
    assert ok.state == InputRequestState.ANSWERED
    failure = AuditEvent.objects.get(task_id=task.id, action="input.delivery_failed")
    assert failure.data["key"] == "ok" and failure.data["error"]["code"] == -32602


def test_delivery_rides_out_an_unreachable_server_then_gives_up_with_a_record(operator, approver):
    nowhere = create_server(name="down", transport="http", url=f"http://127.0.0.1:{free_port()}/mcp", user=None)
    task = launched(nowhere, operator, "approval")
    snapshot = {
        "taskId": "remote-1",
        "status": "input_required",
        "createdAt": "2026-07-28T10:00:00Z",
        "lastUpdatedAt": "2026-07-28T10:00:00Z",
        "ttlMs": None,
        "inputRequests": {"ok": {"method": "elicitation/create", "params": {"message": "OK?", "requestedSchema": {}}}},
    }
    services.record_launch_outcome(task=task, outcome=TaskCreated(task=TaskSnapshot.model_validate(snapshot)))
    ok = InputRequest.objects.get(task=task, key="ok")
    services.answer_input(input_request=ok, response={"action": "decline"}, user=approver)

    with pytest.raises(TransportError):
        run(jobs.deliver)(ok.pk, last_attempt=False)  # procrastinate retries it with backoff
    [job] = jobs_of("taskhub.deliver_answer")
    assert job.priority == hooks.DELIVERY_PRIORITY
    run(run_worker_until_idle)()
    [job] = jobs_of("taskhub.deliver_answer")
    assert (job.status, job.attempts) == ("todo", 1) and job.scheduled_at > timezone.now()
    assert job.priority == hooks.LAUNCH_PRIORITY  # the retry of an answer to a server in trouble waits its turn

    assert run(jobs.deliver)(ok.pk, last_attempt=True) == "gave up"
    assert AuditEvent.objects.filter(task_id=task.id, action="input.delivery_failed").exists()
    ok.refresh_from_db()
    assert ok.state == InputRequestState.ANSWERED


# --- cancel delivery --------------------------------------------------------------------------------


def test_a_cancel_is_delivered_once_and_the_task_polled_at_once(server, operator, demo):
    task = launched(server, operator, "long", {"seconds": 30})
    run(jobs.launch)(task.id)
    task = reload(task)
    TaskPoll.objects.filter(task=task).update(next_poll_at=timezone.now() + datetime.timedelta(hours=1))
    services.request_cancel(task=task, user=operator)
    [job] = jobs_of("taskhub.deliver_cancel")
    assert job.args == {"task_id": str(task.id)}

    run(run_worker_until_idle)()
    assert run(jobs.cancel)(task.id) == "nothing to cancel"
    task = reload(task)
    assert task.cancel_delivered_at is not None
    assert demo_stats(demo)["cancels"][task.remote_task_id] == 1
    assert TaskPoll.objects.get(task=task).next_poll_at <= timezone.now()
    assert audit(task)[-2:] == ["task.cancel_requested", "task.cancel_delivered"]
    assert follow(task, lambda t: t.is_terminal).status == TaskStatus.CANCELLED


def test_a_cancel_waits_while_the_tool_call_is_under_way(server, operator):
    # (A cancel before the call is sent ends the task at once: tests/test_launch_feedback.py.)
    task = launched(server, operator, "long", {"seconds": 30})
    call = services.mark_launch_sent(task=task)  # the launch job is sending tools/call now
    services.request_cancel(task=task, user=operator)
    with pytest.raises(jobs.LaunchPending):
        run(jobs.cancel)(task.id, last_attempt=False)

    async def send() -> TaskCreated:
        async with TasksClient(server.to_target(), timeout=10) as client:
            return await client.call_tool(call.tool, call.arguments)

    services.record_launch_outcome(task=task, outcome=run(send)())  # what the launch job does with the answer
    assert run(jobs.cancel)(task.id, last_attempt=False) == "delivered"
    assert follow(task, lambda t: t.is_terminal).status == TaskStatus.CANCELLED


def test_a_cancel_during_mrtr_rounds_ends_the_call_here(server, operator, approver):
    task = launched(server, operator, "mrtr")
    run(jobs.launch)(task.id)
    services.request_cancel(task=task, user=operator)
    assert run(jobs.cancel)(task.id) == "cancelled before any server task"
    task = reload(task)
    assert task.status == TaskStatus.CANCELLED and task.finished_at
    assert InputRequest.objects.get(task=task).state == InputRequestState.SUPERSEDED


# --- precedence: answers and cancels before launches -----------------------------------------------


@pytest.mark.embedded
def test_an_answer_and_a_cancel_run_before_the_launches_queued_ahead_of_them(server, operator, approver, demo):
    waiting = approval_waiting(server, operator)
    running = launched(server, operator, "long", {"seconds": 30})
    run(jobs.launch)(running.id)
    running = reload(running)
    queued = [launched(server, operator, "quick", {"text": f"queued-{n}"}) for n in range(12)]
    approve = InputRequest.objects.get(task=waiting, key="approve")
    services.answer_input(input_request=approve, response={"action": "decline"}, user=approver)
    services.request_cancel(task=running, user=operator)

    concurrency = 2
    run(run_worker_until_idle)(timeout=60, concurrency=concurrency)

    assert [reload(task).status for task in queued] == [TaskStatus.COMPLETED] * len(queued)
    assert demo_stats(demo)["deliveries"][f"{waiting.remote_task_id}/approve"] == 1
    assert demo_stats(demo)["cancels"][running.remote_task_id] == 1
    trail = AuditEvent.objects.order_by("id")
    delivered = trail.get(task_id=waiting.id, action="input.delivered").id
    cancelled = trail.get(task_id=running.id, action="task.cancel_delivered").id
    sent = trail.filter(task_id__in=[task.id for task in queued], action="task.launch_sent")
    # Both were taken first; only launches started while one of them was on the wire can precede it.
    assert sent.filter(id__lt=max(delivered, cancelled)).count() < concurrency, list(sent.values_list("id", flat=True))


# --- sweeps -----------------------------------------------------------------------------------------


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


def test_the_expiry_sweep_expires_live_tasks_past_created_at_plus_ttl_without_progress(server, operator):
    overdue = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=60_000, remote_id="old")
    unlimited = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=None, remote_id="forever")
    fresh = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=10**12, remote_id="fresh")
    # The deadline is past for `overdue` only; it last changed before the deadline (set by the test clock).
    Task.objects.filter(pk=overdue.pk).update(updated_at=datetime.datetime(2026, 7, 28, 10, 0, 30, tzinfo=datetime.UTC))
    now = datetime.datetime(2026, 7, 28, 10, 3, tzinfo=datetime.UTC)

    assert [task.pk for task in sweeps.expire_overdue(now=now)] == [overdue.pk]
    assert reload(overdue).status == TaskStatus.EXPIRED
    assert not TaskPoll.objects.filter(task=overdue).exists()
    assert reload(unlimited).status == reload(fresh).status == TaskStatus.WORKING
    assert sweeps.expire_overdue(now=now) == []


def test_a_task_that_changed_after_its_deadline_is_not_expired(server, operator):
    task = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=60_000, remote_id="busy")
    Task.objects.filter(pk=task.pk).update(updated_at=datetime.datetime(2026, 7, 28, 10, 2, tzinfo=datetime.UTC))
    assert sweeps.expire_overdue(now=datetime.datetime(2026, 7, 28, 10, 5, tzinfo=datetime.UTC)) == []
    # Within the grace after the deadline the tracker may still see the true end.
    assert sweeps.expire_overdue(now=datetime.datetime(2026, 7, 28, 10, 1, 30, tzinfo=datetime.UTC)) == []


def test_retention_deletes_old_finished_tasks_and_keeps_their_audit(server, operator, approver, settings):
    old = launched(server, operator, "mrtr")
    services.record_launch_outcome(
        task=old,
        outcome=ToolInputRequired(input_requests={"name": {"method": "elicitation/create"}}, request_state="s"),
    )
    services.request_cancel(task=old, user=operator)
    services.cancel_before_remote_task(task=old)
    recent = launched(server, operator, "quick", {"text": "recent"})
    run(jobs.launch)(recent.id)
    running = live_task(server, operator, created_at="2026-07-28T10:00:00Z", ttl_ms=None, remote_id="running")
    Task.objects.filter(pk=old.pk).update(finished_at=timezone.now() - datetime.timedelta(days=31))
    Task.objects.filter(pk=running.pk).update(created_at=timezone.now() - datetime.timedelta(days=90))
    history = AuditEvent.objects.filter(task_id=old.id).count()

    assert sweeps.purge_finished(now=timezone.now(), retention_days=30) == 1
    assert set(Task.objects.values_list("pk", flat=True)) == {recent.pk, running.pk}
    assert not InputRequest.objects.filter(task_id=old.id).exists()
    assert AuditEvent.objects.filter(task_id=old.id).count() == history + 1
    assert AuditEvent.objects.filter(task_id=old.id).last().action == "task.purged"
    assert sweeps.purge_finished(now=timezone.now(), retention_days=0) == 0

    settings.TASKHUB_RETENTION_DAYS = 0
    assert run(sweeps.purge_old_tasks.__wrapped__)(_Context(app), timestamp=0) == 0


# --- fairness: one slow server holds its share of a worker's slots, not all of them -----------------------------


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


def test_an_idle_worker_is_woken_for_an_answer_by_its_jobs_notify_not_by_polling(server, operator, approver, demo):
    """procrastinate LISTENs for new jobs (the insert's trigger NOTIFYs at commit): a worker that would look for jobs
    only once an hour delivers an answer given while it waits (bench/approval.py: answer stored -> job started)."""
    task = approval_waiting(server, operator)
    request = InputRequest.objects.get(task=task, key="approve")
    with worker_in_thread(concurrency=2, fetch_job_polling_interval=3600):
        # Once the jobs it starts with (the periodic ones) are done, it has found the queue empty and waits.
        busy = ProcrastinateJob.objects.filter(status__in=["todo", "doing"])
        wait_until(lambda: not busy.exists(), what="the worker idle")
        services.answer_input(input_request=request, response=APPROVE_ANSWER, user=approver)
        wait_until(
            lambda: InputRequest.objects.get(pk=request.pk).state == InputRequestState.DELIVERED,
            what="the answer delivered by the worker, woken by the job's notify",
        )
    assert demo_stats(demo)["deliveries"][f"{task.remote_task_id}/approve"] == 1


@pytest.fixture
def silent_server() -> Iterator[HostileServer]:
    with HostileServer() as hostile:
        hostile.tool("never", Silence())
        yield hostile


def test_a_server_whose_tool_never_answers_holds_only_its_share_of_the_worker(
    server, operator, approver, silent_server, monkeypatch
):
    """Issue 14: 20 launches of a tool that never answers held all 20 slots of a worker for the launch timeout,
    and every other server's answers and launches waited behind them. Here a worker of 4 slots (a server's share:
    1) gets 6 such launches; the other servers' answer and launch still go out at once, long before the slow
    server's call timeout (30 s), and its waiting launches keep their whole retry budget."""
    monkeypatch.setattr(slots.SLOTS, "concurrency", 4)  # what `manage.py worker --concurrency 4` sets
    slow = update_server(server=register(silent_server), user=None, call_timeout_seconds=30)
    slow_launches = [launched(slow, operator, "never") for _ in range(6)]
    waiting = approval_waiting(server, operator)
    approve = InputRequest.objects.get(task=waiting, key="approve")
    third = create_server(name="third", transport="http", url=server.url, user=None)

    with worker_in_thread(concurrency=4):
        wait_until(lambda: silent_server.tool_calls, what="the slow tool's first call", timeout=15)
        # The worker has looked at every slow launch: one runs, the others wait for their server, due again later.
        wait_until(lambda: due_jobs() == 0, what="the worker to get past the slow server's launches", timeout=10)
        answered_at = time.monotonic()
        services.answer_input(input_request=approve, response={"action": "decline"}, user=approver)
        quick = launched(third, operator, "quick", {"text": "not starved"})

        wait_until(
            lambda: InputRequest.objects.get(pk=approve.pk).state == InputRequestState.DELIVERED,
            what="the other server's answer to be delivered",
            timeout=15,
        )
        delivered_after = time.monotonic() - answered_at
        wait_until(lambda: reload(quick).status == TaskStatus.COMPLETED, what="the third server's launch", timeout=15)
        started_after = time.monotonic() - answered_at
        assert silent_server.tool_calls == ["never"]  # its share: one call at a time
        slow_ids = {str(task.id) for task in slow_launches}
        waiting_launches = [job for job in jobs_of(hooks.LAUNCH_JOB) if job.args["task_id"] in slow_ids]
    assert delivered_after < 10 and started_after < 10, (delivered_after, started_after)
    assert all(reload(task).status == TaskStatus.LAUNCHING for task in slow_launches)
    # Retried while their server was busy, and not one attempt spent: they still have their budget to reach it.
    assert any(job.status == "todo" for job in waiting_launches)
    assert all(job.attempts <= 0 for job in waiting_launches), [(job.status, job.attempts) for job in waiting_launches]


def test_a_servers_share_of_the_slots_and_its_call_timeout(settings):
    pool = slots.ServerSlots()
    pool.concurrency = 20
    assert pool.share(Server(pk=1)) == 5  # a quarter of the worker's concurrency
    settings.TASKHUB_MAX_JOBS_PER_SERVER = 2
    assert pool.share(Server(pk=1)) == 2
    assert pool.share(Server(pk=1, max_concurrent_jobs=50)) == 20  # never more than the whole worker
    pool.concurrency = 2
    assert pool.share(Server(pk=1, max_concurrent_jobs=1)) == 1

    first, second = pool.slot(Server(pk=7)), pool.slot(Server(pk=7))
    assert first.try_take() and second.try_take()
    with pytest.raises(slots.ServerBusy):
        run(pool.slot(Server(pk=7)).take)(wait=0.05)
    assert pool.slot(Server(pk=8)).try_take()  # another server's share is its own

    async def waits_for_the_slot_given_back() -> float:
        waiting = pool.slot(Server(pk=7))
        taking = asyncio.create_task(waiting.take(wait=30))
        await asyncio.sleep(0.05)
        assert not taking.done()
        given_back = time.monotonic()
        await asyncio.to_thread(first.release)  # from another thread, as a job's database thread may
        await taking
        return time.monotonic() - given_back

    assert run(waits_for_the_slot_given_back)() < 5  # woken by the release, not by its 30 s wait
    first.release()  # releasing twice gives back one slot
    assert pool.taken(7) == 2

    settings.TASKHUB_LAUNCH_TIMEOUT_SECONDS = 120
    assert slots.launch_timeout(Server()) == 120
    assert slots.launch_timeout(Server(call_timeout_seconds=5)) == 5
    settings.TASKHUB_LAUNCH_TIMEOUT_CAP_SECONDS = 600
    assert slots.launch_timeout(Server(call_timeout_seconds=3600)) == 600
