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

OneTripHandler is Django's ASGI handler, but a request to a sync view (every page, the API, the answer view) runs
its whole middleware chain and the view in one trip to that thread, as WSGI runs them. Django's async chain sends
the request back to the event loop at its bottom (its async get_response) and then to the thread again for the
view, for CSRF's process_view and for a template response: six trips in all, each waiting its turn on an event
loop that also serves every live socket (about 1 ms of every answer before the view begins: bench/approval.py);
now three (request_started, the chain with its view, and close). Async views (the gateway) keep Django's chain.
"""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.db import connections
from django.urls import Resolver404, get_resolver

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


class OneTripHandler(ASGIHandler):
    def __init__(self):
        super().__init__()  # Django's async middleware chain, for async views
        self.sync_handler = BaseHandler()
        self.sync_handler.load_middleware(is_async=False)

    async def get_response_async(self, request):
        if _async_view(request.path_info):
            return await super().get_response_async(request)
        return await sync_to_async(self.sync_handler.get_response, thread_sensitive=True)(request)


def _async_view(path_info: str) -> bool:
    try:
        match = get_resolver().resolve(path_info)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)
