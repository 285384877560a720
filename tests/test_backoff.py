"""One exponential backoff (taskhub/backoff.py) for job retries, failed polls, stdio restarts and webhook deliveries:
each caller's delays are the ones its own formula gave before it moved there."""

from taskhub import backoff
from taskhub.worker.tracker.polling import backoff_delay_ms


def test_doubles_from_the_first_delay_up_to_the_cap_and_never_overflows():
    assert [backoff.exponential(n, first=0.5, cap=5) for n in range(-1, 6)] == [0.5, 0.5, 1, 2, 4, 5, 5]
    assert backoff.exponential(10**6, first=1, cap=300) == 300


def test_the_tracker_waits_as_before():
    # Before: min(base * 2 ** max(failures - 1, 0), cap) * 1000, ± 10 % jitter
    for failures, before in ((0, 1000), (1, 1000), (2, 2000), (3, 4000), (7, 60000), (8, 60000)):
        delay = backoff_delay_ms(failures, base_seconds=1, cap_seconds=60)
        assert 0.9 * before <= delay <= 1.1 * before, (failures, delay)


def test_job_retries_wait_as_before():
    from django.utils import timezone

    from taskhub.worker.jobs import Backoff

    strategy = Backoff(max_attempts=9, retry_exceptions=(), first_seconds=2.0, cap_seconds=60.0)
    for attempts in range(8):
        before = min(60.0, 2.0 * 2**attempts)  # the formula it replaced: min(cap, first * 2**attempts) ± 20 %
        wait = (strategy.next_try_at(attempts) - timezone.now()).total_seconds()
        assert 0.8 * before - 0.5 <= wait <= 1.2 * before, (attempts, wait)
