"""The live sockets' database work (access reads, renderings) runs on threads of its own.

channels' `database_sync_to_async` is thread-sensitive by default: under daphne every call runs on the process's
one sync thread, which also runs every view. A change reaching the sockets queued its renderings there, and the
next request (an approver's Accept, the list's re-fetch) waited behind them (bench/RESULTS.md, approval). The live
work only reads and renders, and needs no thread affinity, so it runs on a small pool instead. Each pool thread
has its own database connection (Django's connections are per thread), opened and recycled by
`close_old_connections` before and after each call, as on the sync thread.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from channels.db import DatabaseSyncToAsync
from django.db import connections

# Renderings are mostly Python under the GIL: more threads do not render faster. With two, one change's renderings
# for the detail page's socket and the list page's ran at once, each as long as both, and the watched task's sections
# (sent first, consumer.py) waited for the list's: change → the detail page's DOM p50 44-48 ms with two threads,
# 33-34 with one (bench/freshness.py); fan-out to 2,000 sockets stayed within the same spread (bench/fanout.py).
# So one, and each process's live work is done in the order it was asked for.
LIVE_THREADS = 1

_executor = ThreadPoolExecutor(max_workers=LIVE_THREADS, thread_name_prefix="taskhub-live")


def on_live_thread(function):
    """`database_sync_to_async(function)`, run on the live pool rather than on the thread that serves views."""
    return DatabaseSyncToAsync(function, thread_sensitive=False, executor=_executor)


def close_live_connections(timeout: float = 10) -> None:
    """Close every pool thread's database connection (tests: an open one keeps the test database from being
    dropped)."""
    close_pool_connections(_executor, LIVE_THREADS, timeout=timeout)


def close_pool_connections(executor: ThreadPoolExecutor, threads: int, *, timeout: float = 10) -> None:
    """Close the database connection of each of a pool's `threads` threads. One call per thread: each waits at a
    barrier until all threads have one, so none takes two."""
    barrier = threading.Barrier(threads)

    def close_this_threads() -> None:
        connections.close_all()
        barrier.wait(timeout)

    for future in [executor.submit(close_this_threads) for _ in range(threads)]:
        future.result(timeout + 1)
