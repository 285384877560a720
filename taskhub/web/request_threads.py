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

OneTripHandler is Django's ASGI handler, but a request to a sync view (every page, the API, the answer view) sends
request_started and runs its whole middleware chain and the view in one trip to that thread, as WSGI runs them.
Django's async chain sends the request back to the event loop at its bottom (its async get_response) and then to
the thread again for the view, for CSRF's process_view and for a template response, with request_started's
receivers (the connection checks) in a trip of their own before and close after: six trips in all, each waiting
its turn on an event loop that also serves every live socket (about 1 ms of every answer before the view begins:
bench/approval.py); now two (request_started with the chain and its view, and close). Async views (the gateway)
keep Django's chain.

A gateway request may be answered before Django sees it (`direct_answers`: taskhub.gateway.direct answers a plain
`tasks/get` on the event loop, from a connection pool of its own); when that answer declines, the request goes on as
below, its body given to Django again as it was read.

An async view's request (the gateway: a waiting `tools/call` may stay open for a minute, idle) gets no kept thread,
unless its `Mcp-Method` header names a method answered at once (`tasks/get` and the like: ANSWERED_AT_ONCE) or
`subscriptions/listen` (below): its sync parts (the middleware) run on an IdleExitingExecutor, whose one thread
closes its database connection and exits once nothing has been given to it for a moment, and starts again if the
request has sync work later. So an idle wait holds neither a thread nor a connection. The executor is kept for the next
such request when this one ends (as a kept thread is): an agent's calls one after another find its thread still there,
not a thread started for each. The view does its database work on the gateway's pool of kept threads
(SERVED_WITHOUT_A_KEPT_THREAD), not on that thread, whose connection would be new whenever the thread is.

A response that stays open for minutes, idle (StreamAfterRequest: a gateway `subscriptions/listen` stream), has its
body sent here after Django has finished its request, which ran in a context of its own (a copy): the request, its
headers and body file, the middleware's objects, what the request set in its context, and its thread are freed (the
thread a kept one: the request is as short as an answer at once), and the open stream holds only its own state and
daphne's connection (an idle stream 61.6 KB of daphne's memory before, 27.8 after: bench/gateway.py --listen).
"""

import asyncio
import contextlib
import contextvars
import functools
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import aclosing, closing

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.db import connections
from django.http import StreamingHttpResponse
from django.urls import Resolver404, get_resolver, set_script_prefix

logger = logging.getLogger(__name__)

# OneTripHandler.handle is a fork of this Django version's ASGIHandler.handle (its source's sha256 when forked):
# tests/test_forks.py fails when the installed Django differs, so the fork is read again before an upgrade lands.
FORKED_FROM_DJANGO = (6, 1)
FORKED_HANDLE_SHA256 = "c91f27c7fcdc3fff4f1c7082e91cb30f0bfaa5781ca632a116b1d9e607fd752a"

# Threads (and database connections) kept idle between requests; more concurrent requests get a thread for
# their duration only, whose connection is closed when it ends.
KEPT_THREADS = 4


class KeptRequestThreads:
    def __init__(self, app, *, kept: int = KEPT_THREADS, direct_answers: dict | None = None):
        self.app = app
        self.kept = kept
        # Mcp-Method → a coroutine function answering such a request from its scope and body on the event loop, or
        # returning None for Django to answer it (taskhub.gateway.direct).
        self.direct_answers = direct_answers or {}
        self.idle: list[ThreadPoolExecutor] = []
        self.idle_answering_at_once: list[ThreadPoolExecutor] = []
        self.idle_exiting: list[IdleExitingExecutor] = []
        self._turns_at_once: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and _async_view(scope.get("path", "")):
            method = _mcp_method(scope.get("headers", ()))
            if method in ANSWERED_AT_ONCE:
                await self._answer_at_once(scope, receive, send, direct=self.direct_answers.get(method))
            elif method == LISTEN:
                # Its request is as short as an answer at once: the stream is sent after it (StreamAfterRequest).
                await self._then_stream(self._answer_at_once, scope, receive, send)
            else:
                await self._then_stream(self._on_idle_exiting_thread, scope, receive, send)
            return
        await self._on_kept_thread(self.idle, scope, receive, send)

    async def _then_stream(self, serve, scope, receive, send) -> None:
        """`serve` the request, then send the body of a StreamAfterRequest it left (OneTripHandler), once the request's
        thread and context are released."""
        scope[STREAM_AFTER_REQUEST] = None
        try:
            # In a context of its own: what the request sets in its contextvars (Django's locals: the URLconf, the
            # language, asgiref's thread context) goes with it, not kept by the stream for its life.
            await asyncio.create_task(serve(scope, receive, send), context=contextvars.copy_context())
            handed_off = scope.pop(STREAM_AFTER_REQUEST)
        finally:
            left = scope.pop(STREAM_AFTER_REQUEST, None)
            if left is not None:  # the request failed after its head was sent: the body will never be
                left.end()
        if handed_off is not None:
            await handed_off.send(send, receive)

    async def _on_idle_exiting_thread(self, scope, receive, send) -> None:
        SERVED_WITHOUT_A_KEPT_THREAD.set(True)  # in the request's own context (_then_stream)
        # One given back by an earlier request: its thread is still there if that request ended less than
        # IDLE_THREAD_EXIT_SECONDS ago (an agent's calls one after another), not started again for each.
        executor = self.idle_exiting.pop() if self.idle_exiting else IdleExitingExecutor()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.app(scope, receive, send)
        finally:
            self._release(executor, self.idle_exiting, asyncio.get_running_loop())

    async def _answer_at_once(self, scope, receive, send, direct=None) -> None:
        """A gateway request answered from one read: answered `direct`ly when it can be (without a thread), else by
        Django, at most KEPT_THREADS at once, on threads kept for them (an agent polling many tasks gets answered by
        the same few connections); the others wait their turn without a thread, not on a new thread with a new
        connection each (bench/gateway.py, 16 at a time: 131 tasks/get a second before, 202 after, with the sync
        views)."""
        if direct is not None:
            body, receive = await _read_and_replay(receive, limit=DIRECT_BODY_LIMIT)
            answer = None if body is None else await direct(scope, body)
            if answer is not None:
                await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
                await send({"type": "http.response.body", "body": answer.body})
                return
        loop = asyncio.get_running_loop()
        turns = self._turns_at_once.get(loop)
        if turns is None:
            turns = self._turns_at_once[loop] = asyncio.Semaphore(self.kept)
        async with turns:
            await self._on_kept_thread(self.idle_answering_at_once, scope, receive, send)

    async def _on_kept_thread(self, idle: list[ThreadPoolExecutor], scope, receive, send) -> None:
        executor = idle.pop() if idle else self._new_executor()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.app(scope, receive, send)
        finally:
            self._release(executor, idle, asyncio.get_running_loop())

    def close_connections(self) -> None:
        """Close the idle threads' database connections (tests: an open one keeps the test database from
        being dropped)."""
        for executor in [*self.idle, *self.idle_answering_at_once, *self.idle_exiting]:
            executor.submit(connections.close_all).result()

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskhub-request")

    def _release(self, executor: Executor, idle: list, loop: asyncio.AbstractEventLoop) -> None:
        # Idle again only once its thread has finished what this request left on it: a view goes on running
        # after its client left and the request was cancelled, and the next request must not queue behind it.
        def finished(_future) -> None:
            try:
                loop.call_soon_threadsafe(self._keep_or_retire, executor, idle)
            except RuntimeError:  # the loop is closed (process or test ending)
                self._retire(executor)

        executor.submit(_nothing).add_done_callback(finished)

    def _keep_or_retire(self, executor: ThreadPoolExecutor, idle: list) -> None:
        if len(idle) < self.kept:
            idle.append(executor)
        else:
            self._retire(executor)

    def _retire(self, executor: Executor) -> None:
        executor.submit(connections.close_all)
        executor.shutdown(wait=False)


def _nothing() -> None:
    pass


async def _read_and_replay(receive, *, limit: int):
    """The request's body when it is whole within `limit` bytes (else None, and None if the client left first), and
    a `receive` that gives what was read again, then what the client sends next (the rest of the body, its
    disconnect), for Django to read when it is the one to answer."""
    chunks, size, whole, disconnect = [], 0, False, None
    while size <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnect = message
            break
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body"):
            whole = True
            break
    read = b"".join(chunks)
    # What Django is given first: the body read so far, or the client's leaving (daphne tells it only once).
    first = disconnect or {"type": "http.request", "body": read, "more_body": not whole}
    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return first
        return await receive()

    return (read if whole and size <= limit else None), replay


# How long an async view's request thread waits for more work before it closes its connection and exits.
IDLE_THREAD_EXIT_SECONDS = 1.0


class IdleExitingExecutor(Executor):
    """One thread at a time, in submission order (what a ThreadSensitiveContext needs of its executor), that exits
    after IDLE_THREAD_EXIT_SECONDS without work, closing its database connections first; the next submit starts
    a new one. The work queue is handed from the exiting thread to the next under the lock, so order is kept."""

    def __init__(self, *, idle_seconds: float = IDLE_THREAD_EXIT_SECONDS):
        self.idle_seconds = idle_seconds
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._shut_down = False
        self.threads_started = 0

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.put((future, fn, args, kwargs))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="taskhub-async-request", daemon=True)
                self.threads_started += 1
                self._thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut_down = True
            thread = self._thread
            self._work.put(None)  # wakes an idle thread, which then exits
        if wait and thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            try:
                item = self._work.get(timeout=self.idle_seconds)
            except queue.Empty:
                item = None  # idle for idle_seconds: exit as on shutdown's wake-up
            if item is None:
                connections.close_all()
                with self._lock:
                    if self._work.empty():
                        self._thread = None
                        return
                continue
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:
                future.set_exception(error)


# True in an async view's request served here without a kept thread (a gateway `tools/call`): its thread is new, and a
# connection it opened would be too, so the view does its database work on a pool of kept threads instead
# (taskhub.gateway.waiting.in_turn).
SERVED_WITHOUT_A_KEPT_THREAD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "taskhub_served_without_a_kept_thread", default=False
)

# The scope key under which OneTripHandler hands a StreamAfterRequest's body to KeptRequestThreads.
STREAM_AFTER_REQUEST = "taskhub.stream_after_request"


class StreamAfterRequest(StreamingHttpResponse):
    """A streaming response (of an async iterator) whose body is sent after Django has finished its request, when
    served by daphne (KeptRequestThreads): a stream open for minutes then keeps no request, no middleware object and
    no request context (an idle gateway `subscriptions/listen` stream cost 60 KB of daphne's memory, of which Django's
    objects about 19: bench/gateway.py --listen). Served any other way (Django's test clients) it is a
    StreamingHttpResponse. `on_end` runs once the stream has ended, however it ended (the body ran out, the client
    left, an error), or when the response is closed unsent."""

    def __init__(self, streaming_content, *, on_end: Callable[[], None], **kwargs) -> None:
        super().__init__(streaming_content, **kwargs)
        self._on_end = on_end
        self._resource_closers.append(on_end)

    def hand_off(self) -> "HandedOffBody":
        """The body and `on_end`, taken out: the response itself now streams nothing, and closing it (Django does so
        as the request finishes) runs only the request's own closers (which hold the request)."""
        body = HandedOffBody(self._iterator, self._on_end)
        self._resource_closers.remove(self._on_end)
        self._on_end = None
        self.streaming_content = _no_chunks()
        return body


class HandedOffBody:
    __slots__ = ("chunks", "on_end")

    def __init__(self, chunks, on_end: Callable[[], None]) -> None:
        self.chunks = chunks
        self.on_end = on_end

    async def send(self, send, receive) -> None:
        """Each chunk as an ASGI body message until the iterator ends (then the final message) or the client leaves
        (then the iterator is closed: its `finally` runs), as Django's handler streams."""
        try:
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(_until_disconnected(receive))
                    async with _closing_iterator(self.chunks) as chunks:
                        async for chunk in chunks:
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                            del chunk  # not kept while the stream waits for its next
                    await send({"type": "http.response.body"})
                    raise RequestProcessed
            except* (RequestProcessed, RequestAborted):
                pass
        except BaseExceptionGroup as exception_group:
            if len(exception_group.exceptions) == 1:
                raise exception_group.exceptions[0]  # noqa: B904 (the one error, as it was raised)
            raise
        finally:
            self.end()

    def end(self) -> None:
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end()


async def _no_chunks():
    return
    yield


def _closing_iterator(chunks):
    return aclosing(chunks) if hasattr(chunks, "aclose") else contextlib.nullcontext(chunks)


async def _until_disconnected(receive) -> None:
    while True:
        if (await receive())["type"] == "http.disconnect":
            raise RequestAborted


def _head_only(send):
    """`send`, but for the final empty body message of a response whose body was handed off."""

    async def head_only(message) -> None:
        if message["type"] == "http.response.body" and not message.get("body") and not message.get("more_body"):
            return
        await send(message)

    return head_only


class RequestProcessed(Exception):
    """Django's handle() defines this in each call: a class per request, 1.5 KB that an open stream keeps."""


class OneTripHandler(ASGIHandler):
    def __init__(self):
        super().__init__()  # Django's async middleware chain, for async views
        self.sync_handler = BaseHandler()
        self.sync_handler.load_middleware(is_async=False)

    async def handle(self, scope, receive, send):
        """Django's ASGIHandler.handle (6.1), but the request is made before request_started is sent, so that for a
        sync view the signal goes with the chain's trip (get_response_async): its receivers only check the
        connections, which the request's making does not touch."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return

        with closing(body_file):
            set_script_prefix(get_script_prefix(scope))
            request, error_response = self.create_request(scope, body_file)
            if request is not None and not _async_view(request.path_info):
                request.taskhub_started_scope = scope  # sent by get_response_async, on the thread
            elif request is not None and answered_at_once(scope.get("headers", ())):
                request.urlconf = ANSWERED_AT_ONCE_URLCONF  # the gateway's sync views: the sync chain, one trip
                request.taskhub_started_scope = scope
            else:
                await signals.request_started.asend(sender=self.__class__, scope=scope)
            if request is None:
                body_file.close()
                await self.send_response(error_response, send)
                await sync_to_async(error_response.close)()
                return

            response = None
            try:
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self.listen_for_disconnect(receive))
                        response = await self.run_get_response(request)
                        if isinstance(response, StreamAfterRequest) and STREAM_AFTER_REQUEST in scope:
                            scope[STREAM_AFTER_REQUEST] = response.hand_off()
                            send = _head_only(send)
                        await self.send_response(response, send)
                        raise RequestProcessed
                except* (RequestProcessed, RequestAborted):
                    pass
            except BaseExceptionGroup as exception_group:
                if len(exception_group.exceptions) == 1:
                    raise exception_group.exceptions[0]  # noqa: B904 (as Django: the one error, as it was raised)
                raise

            if response is None:
                await signals.request_finished.asend(sender=self.__class__)
            else:
                await sync_to_async(response.close)()

    async def get_response_async(self, request):
        scope = getattr(request, "taskhub_started_scope", None)
        if scope is None:
            return await super().get_response_async(request)
        return await sync_to_async(self._started_and_response, thread_sensitive=True)(request, scope)

    def _started_and_response(self, request, scope):
        signals.request_started.send(sender=self.__class__, scope=scope)
        return self.sync_handler.get_response(request)


# Gateway methods answered from one read, never waiting: they get a kept thread, whose database connection they reuse
# (a new thread's connect was a quarter of daphne's time per tasks/get: bench/gateway.py --profile), and sync views
# (taskhub/urls_at_once.py) that run with the sync chain in one trip, as a page does. The view refuses a request whose
# Mcp-Method header differs from its body's method (gateway.protocol.check_headers), so a tools/call or
# subscriptions/listen, which may wait for minutes, cannot claim either by its header.
ANSWERED_AT_ONCE_URLCONF = "taskhub.urls_at_once"
ANSWERED_AT_ONCE = frozenset(
    {b"tasks/get", b"tasks/update", b"tasks/cancel", b"tools/list", b"server/discover", b"ping"}
)

# The most of a body read before a direct answer is tried (a `tasks/get` is a few hundred bytes); past it, Django reads
# the rest and answers.
DIRECT_BODY_LIMIT = 64 * 1024

# Its request is as short as an answer at once: its stream is sent after it (StreamAfterRequest).
LISTEN = b"subscriptions/listen"


def answered_at_once(headers) -> bool:
    """Whether a request's ASGI headers name, in `Mcp-Method`, a method answered at once."""
    return _mcp_method(headers) in ANSWERED_AT_ONCE


def _mcp_method(headers) -> bytes | None:
    return next((value.strip() for name, value in headers if name == b"mcp-method"), None)


@functools.lru_cache(maxsize=4096)  # a path resolves to the same view for the process's life
def _async_view(path_info: str) -> bool:
    try:
        match = get_resolver().resolve(path_info)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)
