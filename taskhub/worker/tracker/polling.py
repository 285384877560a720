"""What the tracker's parts share: when a task is polled next, what makes a snapshot news, how a problem is
quoted, the counters, and waiting for an event or a timeout."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from dataclasses import dataclass, field

from pydantic_core import PydanticSerializationError

from taskhub import backoff
from taskhub.mcp.wire import MAX_POLL_INTERVAL_MS, MIN_POLL_INTERVAL_MS, TaskSnapshot, bounded_poll_interval_ms

# Each poll comes up to this fraction of the interval later than the server asks (never earlier), so tasks created
# at once drift apart instead of polling in step; the drift adds up poll after poll (a random walk), so a little
# does it. Every change seen by polling waits for half of it on average: 25 ms at 1 s with 5%, 5 ms with 1%
# (bench/freshness.py: the gaps between a task's polls at the server, p50 1,013 ms at 1 s).
JITTER_FRACTION = 0.01
MAX_JITTER_MS = 500
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 30.0
NOT_FOUND_GIVE_UP = 5
IDLE_CLAIM_SECONDS = 0.1
# A claim takes the rows due within this much from now; each is polled at its time. So one claim per
# tick serves every task due before the next one, and no poll waits for a claim (< the interval floor).
CLAIM_AHEAD_SECONDS = 0.25
SERVER_REFRESH_SECONDS = 60.0
# With a live subscription, polling is only a safety net: this often at least, or 10x the task's interval.
SAFETY_NET_MS = 30_000
PROBLEM_TEXT_MAX_CHARS = 500
# Log the tracker's counters (polls, statements, ...) this often, in seconds; 0 (the default) never.
# bench/tracker.py reads them to report database statements per poll.
STATS_LOG_SECONDS = float(os.environ.get("TASKHUB_TRACKER_STATS_SECONDS") or 0)
# Jitter from a generator of its own: the global one belongs to whoever else runs in the process (e.g. tests).
_jitter = random.Random()


@dataclass
class TrackerStats:
    polls: int = 0
    changes: int = 0
    failures: int = 0
    claimed: int = 0
    notifications: int = 0
    claim_statements: int = 0
    reschedule_statements: int = 0
    own_statements: int = 0  # sent on the tracker's own connection (claims, reschedules, renewals, ...)
    orm_statements: int = 0  # sent by the services in the tracker's threads
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def statements(self) -> int:
        return self.own_statements + self.orm_statements

    def count_orm_statement(self) -> None:
        with self._lock:  # the ORM threads count concurrently
            self.orm_statements += 1

    def as_dict(self) -> dict[str, int]:
        counters = {name: value for name, value in vars(self).items() if not name.startswith("_")}
        return {**counters, "statements": self.statements}


def poll_delay_ms(
    poll_interval_ms: int | None, *, floor_ms: int = MIN_POLL_INTERVAL_MS, cap_ms: int = MAX_POLL_INTERVAL_MS
) -> float:
    """The server's latest hint, kept within the floor and cap, plus a little jitter (never earlier)."""
    interval = bounded_poll_interval_ms(poll_interval_ms, floor_ms=floor_ms, cap_ms=cap_ms)
    return interval + _jitter.uniform(0, min(interval * JITTER_FRACTION, MAX_JITTER_MS))


def backoff_delay_ms(failures: int, *, base_seconds: float, cap_seconds: float) -> float:
    """Exponential in the number of failures in a row, capped, with jitter so a fleet does not retry in step."""
    delay = backoff.exponential(failures - 1, first=base_seconds, cap=cap_seconds) * 1000
    return delay * _jitter.uniform(0.9, 1.1)


def snapshot_digest(snapshot: TaskSnapshot) -> bytes:
    """What decides whether a snapshot is news: everything but lastUpdatedAt.

    pydantic's own JSON (fields in declaration order, extra keys in the order sent): a peer that reorders
    its extra keys costs one needless apply_snapshot, which finds nothing to change."""
    try:
        encoded = snapshot.model_dump_json(by_alias=True, exclude_none=True, exclude={"last_updated_at"})
    except PydanticSerializationError:  # a lone surrogate, which JSON can carry and UTF-8 cannot
        encoded = repr(snapshot.model_dump(by_alias=True, exclude_none=True, exclude={"last_updated_at"}))
    return hashlib.blake2b(encoded.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def short(text: str) -> str:
    return text if len(text) <= PROBLEM_TEXT_MAX_CHARS else text[: PROBLEM_TEXT_MAX_CHARS - 1] + "…"
