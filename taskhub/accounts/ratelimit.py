"""Sign-in rate limit: guesses counted per (username, client address) and per client address.

Each bucket keeps the times of its recent guesses in Django's default cache (shared by all web processes: Redis
with REDIS_URL, else the database cache table). A guess is counted *before* its password is checked
(`reserve_attempt`, from the authentication backend): a bucket already holding as many guesses as its limit inside
the window refuses the attempt, right password or not, until its oldest guess leaves the window. A guess that
turns out right is taken back: the username's bucket for that address is cleared, and the guess leaves the address
bucket (one valid account must not reset the count for guessing others). The same answer is given whether or not
the username exists.

Atomic under concurrency: checking and appending to the buckets is done holding a Postgres advisory lock per
bucket (`pg_advisory_xact_lock`, in a short transaction of its own, never across the password hash), whatever the
cache: neither cache has an operation that fits (the database cache's `incr` is a get then a set, and its `add`
takes over an expired row with a plain UPDATE that two requests can both win; Redis is atomic, but its keys expire
as a whole, which would turn the sliding window into a fixed one). Postgres is always there, so one lock serves
both. Before, the limit was read before the slow password hash and the failure written after it: 60 simultaneous
sign-ins were all checked.

While Redis cannot be reached, the counts go to the database cache table instead (logged): sign-in keeps
working and stays limited, though guesses counted in Redis before the outage are not seen meanwhile.

Few at a time: each sign-in takes a database connection for its guess (the lock, the count) and keeps it over the
password hash; 60 guesses sent at once held 60 Postgres connections, and a burst of them ran the server out of
connections (`too many clients`: 500s for everyone, workers included). So a web process checks at most
LOGIN_CONCURRENT_CHECKS sign-ins at once (`one_of_few_sign_ins`); the others wait, holding no connection, and the
connection of one that is done is closed (under ASGI a request's connection is never reused anyway).
"""

import hashlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.db import connection, transaction

logger = logging.getLogger(__name__)

KEY_PREFIX = "signin-failures"


@dataclass(frozen=True)
class Bucket:
    key: str
    limit: int


def client_address(request) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


def _digest(*parts: str) -> str:
    # Hashed: usernames may hold anything (cache keys must be short and plain) and need not sit in the cache.
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def username_bucket(username: str, address: str) -> Bucket:
    return Bucket(f"{KEY_PREFIX}:user:{_digest(username.casefold(), address)}", settings.LOGIN_FAILURES_PER_USERNAME)


def address_bucket(address: str) -> Bucket:
    return Bucket(f"{KEY_PREFIX}:addr:{_digest(address)}", settings.LOGIN_FAILURES_PER_ADDRESS)


def _buckets(username: str, address: str) -> list[Bucket]:
    return [username_bucket(username, address), address_bucket(address)]


def _cached(operation: str, *args: Any, **kwargs: Any) -> Any:
    """`operation` on the default cache or, when that fails and there is one, on the fallback cache."""
    try:
        return getattr(caches["default"], operation)(*args, **kwargs)
    except Exception as error:
        if settings.FALLBACK_CACHE not in settings.CACHES:
            raise
        logger.warning(
            "sign-in rate limit: the cache did not answer (%r); counting in the %r cache meanwhile",
            error,
            settings.FALLBACK_CACHE,
        )
        return getattr(caches[settings.FALLBACK_CACHE], operation)(*args, **kwargs)


def _recent(bucket: Bucket, now: float) -> list[float]:
    window = settings.LOGIN_FAILURE_WINDOW_SECONDS
    times = _cached("get", bucket.key) or []
    return [t for t in times if isinstance(t, (int, float)) and now - window < t <= now]


def _wait(times: list[float], bucket: Bucket, now: float) -> float:
    """0 when the bucket takes another guess, else the seconds until it does: once enough of its guesses have
    left the window to fall under the limit."""
    if len(times) < bucket.limit:
        return 0.0
    return times[len(times) - bucket.limit] + settings.LOGIN_FAILURE_WINDOW_SECONDS - now


def seconds_locked(username: str, address: str) -> int:
    """0 when an attempt may go ahead, else how many seconds until it may (a read, for the sign-in page's answer;
    the attempt itself is let through or refused by reserve_attempt)."""
    now = time.time()
    return math.ceil(max(_wait(sorted(_recent(bucket, now)), bucket, now) for bucket in _buckets(username, address)))


def _lock_id(bucket: Bucket) -> int:
    return int.from_bytes(hashlib.sha256(bucket.key.encode()).digest()[:8], "big", signed=True)


def _locked(buckets: list[Bucket]) -> None:
    """Hold these buckets (always in the order given: username, then address) until the transaction ends."""
    with connection.cursor() as cursor:
        for bucket in buckets:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_id(bucket)])


def reserve_attempt(username: str, address: str) -> tuple[float | None, int]:
    """Count one guess in both buckets before its password is checked: (the guess's time, 0), or (None, the
    seconds to wait) when a bucket is full, and then nothing is counted."""
    buckets = _buckets(username, address)
    window = settings.LOGIN_FAILURE_WINDOW_SECONDS
    with transaction.atomic():
        _locked(buckets)
        now = time.time()
        recent = [sorted(_recent(bucket, now)) for bucket in buckets]
        wait = max(_wait(times, bucket, now) for times, bucket in zip(recent, buckets, strict=True))
        if wait > 0:
            return None, math.ceil(wait)
        for times, bucket in zip(recent, buckets, strict=True):
            _cached(
                "set", bucket.key, [*times[-(bucket.limit - 1) :], now] if bucket.limit > 1 else [now], timeout=window
            )
    return now, 0


def record_failure(username: str, address: str) -> None:
    """A failure counted outside a sign-in (scripts, tests): a guess that was never taken back."""
    reserve_attempt(username, address)


def take_back(username: str, address: str, guessed_at: float) -> None:
    """A guess that was right: the username's bucket is cleared, the guess leaves the address bucket."""
    user_bucket, addr_bucket = _buckets(username, address)
    with transaction.atomic():
        _locked([user_bucket, addr_bucket])
        _cached("delete", user_bucket.key)
        times = _cached("get", addr_bucket.key) or []
        if guessed_at in times:
            times.remove(guessed_at)
            _cached("set", addr_bucket.key, times, timeout=settings.LOGIN_FAILURE_WINDOW_SECONDS)


def clear_username(username: str, address: str) -> None:
    _cached("delete", username_bucket(username, address).key)


_checks_lock = threading.Lock()
_checks: threading.BoundedSemaphore | None = None
_holding = threading.local()


def _concurrent_checks() -> threading.BoundedSemaphore:
    global _checks
    with _checks_lock:
        if _checks is None:
            _checks = threading.BoundedSemaphore(max(1, settings.LOGIN_CONCURRENT_CHECKS))
        return _checks


@contextmanager
def one_of_few_sign_ins() -> Iterator[None]:
    """Held while a sign-in reads and counts its guess and checks its password (the sign-in view, and the backend
    for other forms; nested, it is taken once): at most LOGIN_CONCURRENT_CHECKS at once in this process. A sign-in
    waits here before its first query, so holding no connection, and on the way out its connection is closed
    (outside a transaction), so the connections that sign-ins hold are bounded too."""
    if getattr(_holding, "depth", 0):
        _holding.depth += 1
        try:
            yield
        finally:
            _holding.depth -= 1
        return
    checks = _concurrent_checks()
    checks.acquire()
    _holding.depth = 1
    try:
        yield
    finally:
        _holding.depth = 0
        try:
            if not connection.in_atomic_block:
                connection.close()
        finally:
            checks.release()


def lockout_message(seconds: int) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return f"Too many sign-in attempts; try again in {minutes} minute{'s' if minutes != 1 else ''}."


# --- wiring: every password sign-in (ours and the admin site's) goes through authenticate() -----------------

# Set on the request by the backend: the time of the guess it counted, or that it refused one (locked).
GUESS_ATTRIBUTE = "taskhub_signin_guess"
REFUSED_ATTRIBUTE = "taskhub_signin_refused_seconds"


def on_logged_in(sender, request, user, **kwargs) -> None:
    if request is None:
        return
    guessed_at = getattr(request, GUESS_ATTRIBUTE, None)
    if guessed_at is not None:
        take_back(user.get_username(), client_address(request), guessed_at)
    else:  # signed in without a counted guess (another backend): still a fresh start for this username
        clear_username(user.get_username(), client_address(request))
