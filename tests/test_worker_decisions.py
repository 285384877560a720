"""The worker's pure decisions, without a database or a server: when to poll a task next, how long to back off
from an unreachable server, when a job is retried, and what in a snapshot counts as news."""

import asyncio

from django.utils import timezone
from procrastinate.jobs import Job

from taskhub.mcp.errors import TransportError
from taskhub.mcp.wire import TaskSnapshot
from taskhub.worker import jobs
from taskhub.worker.slots import ServerBusy
from taskhub.worker.tracker.polling import backoff_delay_ms, poll_delay_ms, snapshot_digest

# --- the tracker (taskhub/worker/tracker.py) -----------------------------------------------------------


def test_poll_delay_keeps_the_hint_within_floor_and_cap_and_only_adds_jitter():
    assert 300 <= poll_delay_ms(300) <= 315
    assert 250 <= poll_delay_ms(10) <= 263
    assert 60_000 <= poll_delay_ms(10**9) <= 60_500
    assert 1000 <= poll_delay_ms(None) <= 1050


def test_backoff_doubles_and_is_capped():
    assert 900 <= backoff_delay_ms(1, base_seconds=1, cap_seconds=30) <= 1100
    assert 3600 <= backoff_delay_ms(3, base_seconds=1, cap_seconds=30) <= 4400
    assert 27_000 <= backoff_delay_ms(12, base_seconds=1, cap_seconds=30) <= 33_000


def test_a_snapshot_is_news_unless_only_last_updated_at_moved():
    base = {"taskId": "t", "status": "working", "lastUpdatedAt": "1", "statusMessage": "m", "extra": 1}
    same = snapshot_digest(TaskSnapshot.model_validate(base))
    assert snapshot_digest(TaskSnapshot.model_validate({**base, "lastUpdatedAt": "2"})) == same
    for change in ({"statusMessage": "n"}, {"extra": 2}, {"pollIntervalMs": 500}, {"status": "completed"}):
        assert snapshot_digest(TaskSnapshot.model_validate({**base, **change})) != same, change


# --- job retries (taskhub/worker/jobs.py) ---------------------------------------------------------------


def test_backoff_doubles_up_to_a_cap_for_the_listed_errors_only():
    def job(attempts: int) -> Job:
        return Job(id=1, queue="default", lock=None, queueing_lock=None, task_name="t", attempts=attempts)

    def wait(exception: BaseException, attempts: int) -> float | None:
        decision = jobs.DELIVERY_RETRY.get_retry_decision(exception=exception, job=job(attempts))
        return None if decision is None else (decision.retry_at - timezone.now()).total_seconds()

    unreachable = TransportError("connection refused")
    assert 0.7 < wait(unreachable, 0) <= 1.2
    assert 6 < wait(unreachable, 3) <= 9.6
    assert 230 < wait(unreachable, 20) <= 360  # capped at five minutes, with jitter
    assert wait(unreachable, jobs.DELIVERY_RETRY.max_attempts) is None  # the last attempt records why it gave up
    assert wait(asyncio.CancelledError(), 0) is not None  # a worker stopped mid-job: safe to run again
    assert wait(ValueError("a bug"), 0) is None


def test_a_job_whose_server_is_busy_is_retried_soon_with_its_priority_even_past_its_last_attempt():
    # Nothing was sent: its attempt is given back (jobs.give_back_attempt), and it never gives up for that.
    busy = ServerBusy("server 1 has 5 job(s) running in this worker already")
    for strategy in (jobs.LAUNCH_RETRY, jobs.DELIVERY_RETRY, jobs.CANCEL_RETRY):
        last = Job(id=1, queue="default", lock=None, queueing_lock=None, task_name="t", attempts=strategy.max_attempts)
        decision = strategy.get_retry_decision(exception=busy, job=last)
        assert decision is not None and decision.priority is None  # None keeps the job's own (answers first)
        assert 0.4 < (decision.retry_at - timezone.now()).total_seconds() <= 1.5
