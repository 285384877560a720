"""taskhub.live.sharing: the work one change costs is done once for all sockets asking, and never for a socket
that needs a result newer than the work in flight."""

import asyncio

import pytest

from taskhub.live.sharing import shared


def counting():
    calls = []

    async def work():
        calls.append(len(calls))
        await asyncio.sleep(0.05)
        return len(calls)

    return calls, work


async def test_callers_of_one_key_share_one_result_and_other_keys_do_their_own():
    calls, work = counting()
    results = await asyncio.gather(*(shared(("a", 1), work) for _ in range(50)), shared(("a", 2), work))
    assert results[:50] == [results[0]] * 50
    assert len(calls) == 2


async def test_a_caller_needing_newer_work_starts_it_and_later_callers_get_that():
    calls, work = counting()
    first = await shared("key", work)
    again = await shared("key", work)  # kept: the same result without new work
    newer = await shared("key", work, started_after=asyncio.get_running_loop().time())
    assert (first, again, newer) == (1, 1, 2)
    assert await shared("key", work) == 2 and len(calls) == 2


async def test_a_caller_that_is_cancelled_does_not_cancel_the_work_of_the_others():
    calls, work = counting()
    leaving = asyncio.create_task(shared("key", work))
    staying = asyncio.create_task(shared("key", work))
    await asyncio.sleep(0)
    leaving.cancel()
    assert await staying == 1
    assert len(calls) == 1


async def test_work_that_failed_is_not_kept():
    attempts = []

    async def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("database went away")
        return "rendered"

    with pytest.raises(RuntimeError):
        await shared("key", flaky)
    await asyncio.sleep(0)
    assert await shared("key", flaky) == "rendered"
