"""Kept threads for the sync part of HTTP requests under daphne, so a request does not open a database connection.

Django's ASGI handler runs each request's sync code (middleware, views, signals) in a ThreadSensitiveContext of
its own, which asgiref serves with a new one-thread executor per request: a new thread per request, and since
Django's connections are per thread, a new Postgres connection per request (connect, a new backend, cold catalog
caches: ~13 ms of every page and every answer on the shared machine; bench/RESULTS.md, approval), whatever
CONN_MAX_AGE says. The old connection stays open until the dead thread's objects are collected.

This wraps the HTTP application in a ThreadSensitiveContext whose executor is one of a few kept one-thread
executors (Django's handler then reuses that context), as a threaded WSGI server keeps its threads: a request
still runs all its sync code on one thread of its own, concurrent requests on different threads, and a kept
thread's connection lives CONN_MAX_AGE (request_started / request_finished check it, as under WSGI).
"""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.db import connections

logger = logging.getLogger(__name__)

# Threads (and database connections) kept idle between requests; more concurrent requests get a thread for
# their duration only, whose connection is closed when it ends.
KEPT_THREADS = 4


class KeptRequestThreads:
    def __init__(self, app, *, kept: int = KEPT_THREADS):
        self.app = app
        self.kept = kept
        self.idle: list[ThreadPoolExecutor] = []

    async def __call__(self, scope, receive, send):
        executor = self.idle.pop() if self.idle else self._new_executor()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.app(scope, receive, send)
        finally:
            self._release(executor, asyncio.get_running_loop())

    def close_connections(self) -> None:
        """Close the idle threads' database connections (tests: an open one keeps the test database from
        being dropped)."""
        for executor in list(self.idle):
            executor.submit(connections.close_all).result()

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskhub-request")

    def _release(self, executor: ThreadPoolExecutor, loop: asyncio.AbstractEventLoop) -> None:
        # Idle again only once its thread has finished what this request left on it: a view goes on running
        # after its client left and the request was cancelled, and the next request must not queue behind it.
        def finished(_future) -> None:
            try:
                loop.call_soon_threadsafe(self._keep_or_retire, executor)
            except RuntimeError:  # the loop is closed (process or test ending)
                self._retire(executor)

        executor.submit(_nothing).add_done_callback(finished)

    def _keep_or_retire(self, executor: ThreadPoolExecutor) -> None:
        if len(self.idle) < self.kept:
            self.idle.append(executor)
        else:
            self._retire(executor)

    def _retire(self, executor: ThreadPoolExecutor) -> None:
        executor.submit(connections.close_all)
        executor.shutdown(wait=False)


def _nothing() -> None:
    pass
