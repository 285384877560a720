"""A worker's job slots: an idle worker woken by its jobs' notify; one slow server holds only its share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.servers.models import Server
from taskhub.servers.services import create_server, update_server
from taskhub.tasks import hooks, services
from taskhub.tasks.models import InputRequest, InputRequestState, TaskStatus
from taskhub.worker import slots
from tests.helpers import wait_until
from tests.hostile_fixtures import register
from tests.hostile_server import HostileServer, Silence
from tests.stack_fixtures import due_jobs
from tests.worker_jobs.job_helpers import (
    APPROVE_ANSWER,
    approval_waiting,
    demo_stats,
    jobs_of,
    launched,
    reload,
    run,
    worker_in_thread,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]


# --- fairness: one slow server holds its share of a worker's slots, not all of them -----------------------------


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
