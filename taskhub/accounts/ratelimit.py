"""Sign-in rate limit: failed attempts counted per (username, client address) and per client address.

Each bucket keeps the times of its recent failures in Django's default cache (shared by all web processes:
Redis with REDIS_URL, else the database cache table). A bucket with as many failures as its limit inside the
window refuses every attempt, right password or not, until its oldest failure leaves the window. The same
answer is given whether or not the username exists. A successful sign-in clears that username's bucket for
that address, never the address bucket (one valid account must not reset the count for guessing others).

While Redis cannot be reached, the counts go to the database cache table instead (logged): sign-in keeps
working and stays limited, though failures counted in Redis before the outage are not seen meanwhile.

Reads and writes are not atomic: two simultaneous failures may count once. That bounds guessing at roughly the
limit times the number of concurrent requests per window, which is still a hard limit.
"""

import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import caches

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


def seconds_locked(username: str, address: str) -> int:
    """0 when an attempt may go ahead, else how many seconds until it may."""
    now = time.time()
    window = settings.LOGIN_FAILURE_WINDOW_SECONDS
    wait = 0.0
    for bucket in _buckets(username, address):
        times = sorted(_recent(bucket, now))
        if len(times) >= bucket.limit:
            # Free again once enough of the failures have left the window to fall under the limit.
            wait = max(wait, times[len(times) - bucket.limit] + window - now)
    return math.ceil(wait)


def record_failure(username: str, address: str) -> None:
    now = time.time()
    window = settings.LOGIN_FAILURE_WINDOW_SECONDS
    for bucket in _buckets(username, address):
        times = sorted(_recent(bucket, now))[-(bucket.limit - 1) :] if bucket.limit > 1 else []
        _cached("set", bucket.key, [*times, now], timeout=window)


def clear_username(username: str, address: str) -> None:
    _cached("delete", username_bucket(username, address).key)


def lockout_message(seconds: int) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return f"Too many sign-in attempts; try again in {minutes} minute{'s' if minutes != 1 else ''}."


# --- wiring: every password sign-in (ours and the admin site's) goes through authenticate() -----------------


def on_login_failed(sender, credentials, request=None, **kwargs) -> None:
    # Django calls this for every failed authenticate(), including one refused while locked (counted too: a
    # locked bucket stays locked while someone keeps trying). Without a request (a script, the test client's
    # login()) there is no address to count against.
    username = credentials.get("username")
    if request is not None and username:
        record_failure(str(username), client_address(request))


def on_logged_in(sender, request, user, **kwargs) -> None:
    if request is not None:
        clear_username(user.get_username(), client_address(request))
