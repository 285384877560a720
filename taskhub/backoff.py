"""The one exponential backoff of taskhub: job retries, the tracker's failed polls, a stdio process's restarts and
webhook deliveries each wait `first`, 2·`first`, 4·`first` … up to `cap` (their callers add jitter where they want
it). Imports nothing of taskhub."""

# 2**64 times any first delay is past any cap; it keeps the float product finite for any attempt count.
MAX_DOUBLINGS = 64


def exponential(doublings: int, *, first: float, cap: float) -> float:
    """`first` doubled `doublings` times (none below zero), at most `cap`."""
    return min(first * 2 ** min(max(doublings, 0), MAX_DOUBLINGS), cap)
