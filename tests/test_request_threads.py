"""taskhub.web.request_threads: HTTP requests under ASGI reuse a few threads (and their database connections)
instead of a new thread and a new Postgres connection per request, without ever sharing a thread between two
requests at once."""

import asyncio
import json
import threading
import time

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from channels.testing import HttpCommunicator
from django.core.signals import request_finished, request_started
from django.db import connection, connections

from taskhub.web.request_threads import KeptRequestThreads, OneTripHandler
from tests.helpers import wait_until


async def get(app, path: str = "/healthz") -> int:
    """The status, once the request has ended (Django closes the response, and sends request_finished, after the
    body is sent)."""
    communicator = HttpCommunicator(app, "GET", path, headers=[(b"host", b"testserver")])
    response = await communicator.get_response(timeout=10)
    await communicator.wait(timeout=10)
    await asyncio.sleep(0.05)  # its thread is given back once it has nothing left to run
    return response["status"]


def sync_app(handle):
    """A minimal ASGI app whose work is sync code run thread-sensitively, as Django's handler runs views."""

    async def app(scope, receive, send):
        await receive()
        await sync_to_async(handle)()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.mark.django_db(transaction=True)
async def test_requests_one_after_another_use_one_thread_and_one_database_connection():
    app = KeptRequestThreads(OneTripHandler())
    seen = []

    def record(**kwargs):
        backend = connection.connection.info.backend_pid if connection.connection is not None else None
        seen.append((threading.get_ident(), backend))

    request_finished.connect(record, dispatch_uid="test-request-threads")
    try:
        assert [await get(app) for _ in range(4)] == [200] * 4
    finally:
        request_finished.disconnect(dispatch_uid="test-request-threads")
        await asyncio.to_thread(app.close_connections)
    assert len(seen) == 4 and seen[0][1] is not None
    assert set(seen) == {seen[0]}, seen


async def trips_to_threads(monkeypatch, path: str) -> tuple[int, list[str]]:
    """The status of a request to `path` through taskhub's HTTP application, and the functions it sent to a thread
    (each SyncToAsync call: one trip from the event loop and back)."""
    trips = []
    call = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        trips.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await call(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    app = KeptRequestThreads(OneTripHandler())
    try:
        status = await get(app, path)
    finally:
        monkeypatch.undo()
        await asyncio.to_thread(app.close_connections)
    return status, trips


@pytest.mark.django_db(transaction=True)
async def test_a_request_goes_to_its_thread_twice_not_once_per_middleware(monkeypatch):
    """taskhub.web.request_threads.OneTripHandler: request_started, the middleware chain and the view run on the
    request's thread in one trip, not a trip from the event loop per process_request and process_response (18 with
    Django's handler alone, 6 with taskhub.web.middleware.middleware_on_one_thread, 3 before request_started went
    with the chain)."""
    started = []
    request_started.connect(
        lambda **kwargs: started.append(threading.current_thread().name),
        weak=False,
        dispatch_uid="test-one-trip-started",
    )
    try:
        status, trips = await trips_to_threads(monkeypatch, "/accounts/login/")
    finally:
        request_started.disconnect(dispatch_uid="test-one-trip-started")
    assert status == 200
    # request_started with the middleware chain, CSRF's process_view, the view and its template response; close
    assert len(trips) == 2, trips
    assert any(trip.endswith("OneTripHandler._started_and_response") for trip in trips), trips
    assert started and started[0].startswith("taskhub-request"), started  # sent once, on the request's thread


@pytest.mark.django_db(transaction=True)
async def test_an_async_view_keeps_djangos_async_chain(monkeypatch):
    """The gateway's views are async: they run on the event loop, not in the sync chain's trip to the thread."""
    status, trips = await trips_to_threads(monkeypatch, "/mcp")
    assert status == 405  # the gateway's answer to a GET: POST JSON-RPC requests
    assert not any(trip.endswith("OneTripHandler._started_and_response") for trip in trips), trips


async def test_concurrent_requests_run_on_threads_of_their_own():
    both_inside = threading.Barrier(2, timeout=5)  # broken (BrokenBarrierError) unless both run at once
    threads = []

    def handle():
        threads.append(threading.get_ident())
        both_inside.wait()

    app = KeptRequestThreads(sync_app(handle))
    assert await asyncio.gather(get(app, "/a"), get(app, "/b")) == [200, 200]
    assert len(set(threads)) == 2


async def test_a_thread_still_running_a_cancelled_request_is_not_given_to_the_next():
    release = threading.Event()
    threads = []

    def handle():
        threads.append(threading.get_ident())
        if len(threads) == 1:
            release.wait(10)  # the first request's view goes on after its client left

    app = KeptRequestThreads(sync_app(handle))
    first = asyncio.create_task(get(app, "/slow"))
    while not threads:
        await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    started = time.monotonic()
    try:
        assert await get(app, "/next") == 200
        assert time.monotonic() - started < 5
        assert threads[1] != threads[0]
    finally:
        release.set()


@pytest.mark.django_db(transaction=True)
def test_an_async_views_thread_closes_its_connection_and_exits_when_idle_and_comes_back_for_more_work():
    """A gateway stream idles for minutes: its request's sync work runs on an IdleExitingExecutor, whose thread
    holds no connection and does not exist while nothing is given to it; later work still runs in order."""
    from taskhub.web.request_threads import IdleExitingExecutor

    executor = IdleExitingExecutor(idle_seconds=0.1)
    backends = []

    def query() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backends.append(cursor.fetchone()[0])
        return threading.get_ident()

    executor.submit(query).result(timeout=10)
    order = [executor.submit(lambda i=i: i) for i in range(50)]
    assert [future.result(timeout=10) for future in order] == list(range(50))
    thread = executor._thread
    assert thread is not None
    thread.join(timeout=10)  # exits by itself once idle
    assert not thread.is_alive() and executor._thread is None

    def backend_gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [backends[0]])
            return cursor.fetchone()[0] == 0

    # its connection was closed before it exited; the server process ends a moment after the client's Terminate
    wait_until(backend_gone, timeout=5, what="the idle thread's Postgres backend to end")

    executor.submit(query).result(timeout=10)
    assert executor.threads_started == 2  # a new thread (the ident of an exited one may be reused)
    executor.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        executor.submit(query)


async def test_an_async_view_gets_no_kept_thread_but_one_that_exits_when_idle_and_serves_the_next_one_till_then():
    """The gateway's endpoint is an async view: its request leaves no kept thread behind, but its executor, whose
    thread exits after a moment idle (IdleExitingExecutor), serves the next such request on that thread while it
    is there, and on a new one once it has exited."""
    app = KeptRequestThreads(OneTripHandler())
    statuses = [await get(app, "/mcp") for _ in range(3)]
    assert all(status in (401, 405, 406) for status in statuses), statuses
    assert app.idle == [] and app.idle_answering_at_once == []
    (executor,) = app.idle_exiting
    assert executor.threads_started == 1
    thread = executor._thread
    await asyncio.to_thread(thread.join, 10)  # idle: it exits by itself
    assert executor._thread is None
    assert await get(app, "/mcp") in (401, 405, 406)
    assert app.idle_exiting == [executor] and executor.threads_started == 2


async def post_gateway(app, method: str, body_method: str, token: str = "") -> tuple[int, dict]:
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": body_method, "params": {"_meta": GATEWAY_META}})
    headers = [(b"host", b"testserver"), (b"content-type", b"application/json"), (b"mcp-method", method.encode())]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    communicator = HttpCommunicator(app, "POST", "/mcp/servers/alpha", body=body.encode(), headers=headers)
    response = await communicator.get_response(timeout=10)
    await communicator.wait(timeout=10)
    await asyncio.sleep(0.05)  # its thread is given back once it has nothing left to run
    return response["status"], json.loads(response["body"])


GATEWAY_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
}


@pytest.mark.django_db(transaction=True)
async def test_a_gateway_method_answered_at_once_goes_to_a_kept_thread_once_and_a_lying_header_is_refused(monkeypatch):
    """`tasks/get` and the like (request_threads.ANSWERED_AT_ONCE, named by the Mcp-Method header) run as a page's
    request does: the gateway's sync view with the chain in one trip, on a thread kept for them with its
    connection. A body whose method is not the header's (a tools/call that would wait) is refused and launches
    nothing."""
    from taskhub.accounts.groups import OPERATORS
    from taskhub.api.tokens import create_token
    from taskhub.tasks.models import Task
    from tests.account_fixtures import make_user

    agent = await sync_to_async(make_user)("agent", OPERATORS)
    _, secret = await sync_to_async(create_token)(user=agent, name="agent")
    trips = []
    call = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        trips.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await call(self, *args, **kwargs)

    app = KeptRequestThreads(OneTripHandler())
    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    try:
        status, answer = await post_gateway(app, "ping", "ping", secret)
        monkeypatch.undo()
        assert (status, answer["result"]) == (200, {"resultType": "complete"})
        assert len(trips) == 2 and trips[0].endswith("OneTripHandler._started_and_response"), trips
        assert len(app.idle_answering_at_once) == 1 and app.idle == []

        status, answer = await post_gateway(app, "tasks/get", "tools/call", secret)
        assert (status, answer["error"]["code"]) == (400, -32020)  # Mcp-Method header does not match
        status, answer = await post_gateway(app, "tasks/get", "tasks/get")
        assert (status, answer["error"]["code"]) == (401, -32000)  # without a token, as the async view answers
        assert await Task.objects.acount() == 0
    finally:
        monkeypatch.undo()
        await asyncio.to_thread(app.close_connections)
        await sync_to_async(connections.close_all)()  # the one the test's own queries opened


@pytest.mark.django_db(transaction=True)
async def test_a_tools_call_served_without_a_kept_thread_does_its_database_work_on_the_gateways_kept_pool(
    monkeypatch, settings
):
    """A `tools/call` may wait a minute, so its request gets a thread of its own that exits when idle
    (IdleExitingExecutor): a connection opened there would be new for every call. Its token check, launch and answer
    run on the gateway's pool instead, whose threads keep their connections."""
    from taskhub.accounts.groups import OPERATORS
    from taskhub.api.tokens import create_token
    from taskhub.gateway import calls
    from taskhub.gateway.waiting import close_gateway_connections
    from taskhub.servers.models import Server
    from taskhub.servers.services import create_server
    from taskhub.tasks.models import Task
    from tests.account_fixtures import make_user

    settings.TASKHUB_GATEWAY_LAUNCH_WAIT_SECONDS = 0  # no worker here: answered with the task at once

    def world() -> str:
        alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
        Server.objects.filter(pk=alpha.pk).update(tools=[{"name": "deploy", "inputSchema": {"type": "object"}}])
        _, secret = create_token(user=make_user("agent", OPERATORS), name="agent")
        return secret

    secret = await sync_to_async(world)()
    threads = []
    for name in ("call_tool", "call_answer"):
        original = getattr(calls, name)

        def on_thread(*args, original=original):
            threads.append(threading.current_thread().name)
            return original(*args)

        monkeypatch.setattr(calls, name, on_thread)
    app = KeptRequestThreads(OneTripHandler())
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "deploy", "arguments": {}, "_meta": GATEWAY_META},
    }
    headers = [
        (b"host", b"testserver"),
        (b"content-type", b"application/json"),
        (b"mcp-method", b"tools/call"),
        (b"mcp-name", b"deploy"),
        (b"authorization", f"Bearer {secret}".encode()),
    ]
    try:
        for _ in range(2):
            communicator = HttpCommunicator(
                app, "POST", "/mcp/servers/alpha", body=json.dumps(body).encode(), headers=headers
            )
            response = await communicator.get_response(timeout=10)
            await communicator.wait(timeout=10)
            assert response["status"] == 200, response["body"]
            assert json.loads(response["body"])["result"]["resultType"] == "task"
        assert await Task.objects.acount() == 2
        assert len(threads) == 4 and all(name.startswith("taskhub-gateway") for name in threads), threads
    finally:
        await asyncio.to_thread(close_gateway_connections)
        await asyncio.to_thread(app.close_connections)
        await sync_to_async(connections.close_all)()
