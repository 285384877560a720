"""The answer delivery job (jobs.deliver): once per key, interrupted and cut-off deliveries, dead and paused
workers, kept clients, unknown tasks and unreachable servers."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from procrastinate.contrib.django import app

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import HttpTarget, TaskCreated, TasksClient
from taskhub.mcp.errors import ProtocolError, TransportError
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.services import create_server
from taskhub.tasks import hooks, services
from taskhub.tasks.models import InputRequest, InputRequestState, TaskPoll
from taskhub.worker import clients, heartbeats, jobs, slots
from taskhub.worker.connector import worker_connector
from tests.demo_process import DemoServer
from tests.helpers import free_port
from tests.stack_fixtures import run_worker_until_idle
from tests.worker_jobs.job_helpers import (
    APPROVE_ANSWER,
    answered_approval,
    approval_waiting,
    as_worker,
    audit,
    beat,
    demo_stats,
    follow,
    jobs_of,
    launched,
    run,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]


# --- answer delivery --------------------------------------------------------------------------------


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


def test_a_delivery_recovered_before_its_silent_worker_was_taken_over_looks_again_in_a_beat(
    server, operator, approver, demo
):
    """procrastinate (its runner's beat, or the minute's sweep) may queue a dead worker's delivery again a beat
    before any heartbeat marks that worker taken over. The recovered job then looks again a beat later, not after
    the long settle (CI once waited 40 s for it); once the worker is taken over, the grace applies and it sends."""
    request = answered_approval(server, operator, approver)
    beat("doomed")
    assert jobs._claim(request, owner="doomed")
    beat("rescuer", seconds_ago=-60)  # a row a minute ahead: the beats a live worker makes meanwhile
    beat("doomed", seconds_ago=settings.TASKHUB_STALLED_WORKER_SECONDS + 1)  # silent, not yet taken over

    with pytest.raises(jobs.NotBefore) as looks_again:
        run(as_worker("rescuer", jobs.deliver))(request.pk, last_attempt=False)
    assert looks_again.value.retry_at <= timezone.now() + heartbeats.TAKE_OVER_DUE
    assert f"{request.task.remote_task_id}/approve" not in demo_stats(demo)["deliveries"]

    beat("doomed", seconds_ago=settings.TASKHUB_STALLED_WORKER_SECONDS + 2, taken_over_seconds_ago=0)
    assert run(as_worker("rescuer", jobs.deliver))(request.pk, last_attempt=False) == "delivered"
    assert demo_stats(demo)["deliveries"][f"{request.task.remote_task_id}/approve"] == 1


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
