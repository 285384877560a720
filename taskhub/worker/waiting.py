"""The worker's one way to pause a loop that must stop promptly (the tracker, the stdio supervisors)."""

import asyncio


async def wait(stop: asyncio.Event, seconds: float, *others: asyncio.Event) -> bool:
    """Sleep up to `seconds`, less if `stop` (or another event) is set; True when `stop` is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in (stop, *others)]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return stop.is_set()
