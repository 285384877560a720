"""When a task may be given up: its server's `createdAt` + `ttlMs` (spec §6), the one rule behind Task.expires_at.

The expiry sweep (worker/sweeps.py), the tracker told "no such task" (worker/tracker), Home's "expiring within the
hour" and the detail page's facts all read the column, written wherever a snapshot is stored (services'
snapshot_values): the sweep finds the overdue among the live tasks with one indexed statement, where it read every
live task with a TTL and parsed its `createdAt` each minute (3-4 s of the worker's CPU at 400,000 live tasks).
"""

from __future__ import annotations

import datetime


def expires_at(*, remote_created_at: str, ttl_ms: int | None) -> datetime.datetime | None:
    """`remote_created_at` + `ttl_ms`; None when unlimited (no TTL), when the server's time is unreadable, or when
    the end lies past what a date can hold (a TTL of millions of years is unlimited too). A time without a zone is
    taken as UTC."""
    if ttl_ms is None or not remote_created_at:
        return None
    try:
        created = datetime.datetime.fromisoformat(remote_created_at)
        if created.tzinfo is None:
            created = created.replace(tzinfo=datetime.UTC)
        return created + datetime.timedelta(milliseconds=ttl_ms)
    except (ValueError, OverflowError):
        return None
