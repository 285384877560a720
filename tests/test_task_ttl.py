"""The one rule for a task's end (taskhub/tasks/ttl.py): the server's createdAt + ttlMs, or none."""

import datetime

import pytest

from taskhub.tasks.ttl import expires_at

UTC = datetime.UTC


@pytest.mark.parametrize(
    ("created", "ttl_ms", "expected"),
    [
        ("2026-07-28T10:00:00Z", 60_000, datetime.datetime(2026, 7, 28, 10, 1, tzinfo=UTC)),
        ("2026-07-28T12:00:00+02:00", 0, datetime.datetime(2026, 7, 28, 10, 0, tzinfo=UTC)),
        # A time without a zone is UTC; a sloppy peer's negative TTL ends before it began, as it says.
        ("2026-07-28T10:00:00", -1000, datetime.datetime(2026, 7, 28, 9, 59, 59, tzinfo=UTC)),
        ("2026-07-28T10:00:00.123456Z", 1, datetime.datetime(2026, 7, 28, 10, 0, 0, 124456, tzinfo=UTC)),
        # Unlimited, unreadable, or past what a date holds (a timedelta's days, the year 9999): no end.
        ("2026-07-28T10:00:00Z", None, None),
        ("", 60_000, None),
        ("yesterday", 60_000, None),
        ("2026-07-28T10:00:00Z", 10**17, None),
        ("2026-07-28T10:00:00Z", 8 * 10**16, None),
    ],
)
def test_a_task_ends_at_its_servers_created_at_plus_its_ttl(created, ttl_ms, expected):
    assert expires_at(remote_created_at=created, ttl_ms=ttl_ms) == expected
