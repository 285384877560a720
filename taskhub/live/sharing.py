"""Work shared by the live sockets of one process (one event loop): the first socket to ask for a key starts
it, the others await the same result instead of doing it again. One change reaches hundreds of sockets;
this is how it costs one rendering per audience instead of one per socket.
"""

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Hashable, Sequence

# A result is kept this long after it was started (then its key starts new work).
KEEP_SECONDS = 10.0

_started: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict] = weakref.WeakKeyDictionary()


async def shared[T](
    key: Hashable, make: Callable[[], Awaitable[T]], *, started_after: float | None = None, keep: float = KEEP_SECONDS
) -> T:
    """make()'s result, shared by every caller with this key. started_after (loop time): a result whose work
    began earlier is not good enough for this caller (it could miss what happened since), so new work starts."""
    loop = asyncio.get_running_loop()
    started = _started.setdefault(loop, {})
    entry = started.get(key)
    if entry is None or (started_after is not None and entry[0] < started_after):
        entry = _start(loop, started, key, make(), keep)
    # A caller that is cancelled (its socket closed) does not cancel the work the others wait for.
    return await asyncio.shield(entry[1])


async def shared_all[T](
    keys: Sequence[Hashable],
    make: Callable[[list[Hashable]], Awaitable[dict[Hashable, T]]],
    *,
    keep: float = KEEP_SECONDS,
) -> list[T]:
    """The results for these keys, each shared as shared() shares one. The keys nobody has started are made by
    one make(those keys) -> {key: result}: one trip to a thread for all the parts a caller lacks, while the parts
    another caller started already are awaited, not made again."""
    loop = asyncio.get_running_loop()
    started = _started.setdefault(loop, {})
    entries = {key: started.get(key) for key in keys}
    missing = [key for key, entry in entries.items() if entry is None]
    if missing:
        work = loop.create_task(make(missing))
        for key in missing:
            entries[key] = _start(loop, started, key, _result_of(work, key), keep)
    return [await asyncio.shield(entries[key][1]) for key in keys]


async def _result_of(work: asyncio.Task, key: Hashable):
    return (await asyncio.shield(work))[key]


def _start(loop: asyncio.AbstractEventLoop, started: dict, key: Hashable, work: Awaitable, keep: float) -> tuple:
    entry = (loop.time(), loop.create_task(work))
    started[key] = entry
    entry[1].add_done_callback(lambda task: _forget_on_error(started, key, entry))
    loop.call_later(keep, _forget, started, key, entry)
    return entry


def _forget(started: dict, key: Hashable, entry: tuple) -> None:
    if started.get(key) is entry:
        del started[key]


def _forget_on_error(started: dict, key: Hashable, entry: tuple) -> None:
    if entry[1].cancelled() or entry[1].exception() is not None:
        _forget(started, key, entry)
