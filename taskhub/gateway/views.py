"""The gateway's endpoints: `/mcp/servers/<name>` and `/mcp`, JSON-RPC over Streamable HTTP (stateless, 2026-07-28).

Async views: everything is one short piece of sync code (calls.py), but for what waits, on the request's kept thread
(a method answered at once, a listen's request) or else on the gateway's pool (a `tools/call`); at most
waiting.REQUEST_TURNS of them run at once in a process (`waiting.in_turn`). A
`tools/call` waiting for its launch outcome and an open `subscriptions/listen` stream are woken by the task's
changes through the channel layer and read Postgres only then, on the gateway's pool (waiting.py): while idle they
hold no thread and no database connection, and they are capped per token and in total. Without a valid API token
nothing is read or written but the token lookup: HTTP 401 with a JSON-RPC error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import mcp_types
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from taskhub.api.tokens import active_token
from taskhub.gateway import calls, waiting
from taskhub.gateway.catalogue import Endpoint
from taskhub.gateway.protocol import (
    Call,
    RpcError,
    check_headers,
    check_meta,
    error_message,
    method_not_found,
    parse_call,
    request_id_of,
    result_message,
    unauthorized,
)
from taskhub.live.hub import HUB_LOST
from taskhub.live.publish import ACCESS_CHANGED, TASK_CHANGED
from taskhub.tasks.models import Task
from taskhub.web.request_threads import StreamAfterRequest

logger = logging.getLogger(__name__)

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
TERMINAL = frozenset({"completed", "failed", "cancelled"})

SYNC_METHODS = {
    "server/discover": lambda endpoint, user, call: calls.discover(endpoint),
    "tools/list": lambda endpoint, user, call: calls.list_tools(endpoint, user),
    "ping": lambda endpoint, user, call: {"resultType": "complete"},
    "tasks/get": calls.get_task,
    "tasks/update": calls.update_task,
    "tasks/cancel": calls.cancel_task,
}


@csrf_exempt
async def server_endpoint(request: HttpRequest, name: str) -> HttpResponse:
    return await _serve(request, Endpoint(server_name=name))


@csrf_exempt
async def aggregate_endpoint(request: HttpRequest) -> HttpResponse:
    return await _serve(request, Endpoint())


def _bearer_user(request: HttpRequest):
    """The token's user, carrying the token itself as `api_token` (as the JSON API's requests do): the services record
    it as the agent of each launch, answer and cancel (calls.agent_token)."""
    header = request.headers.get("Authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = active_token(secret.strip())
    return None if token is None else calls.user_carrying(token)


def _json(message: dict, status: int = 200, **headers: str) -> JsonResponse:
    response = JsonResponse(message, status=status)
    for key, value in headers.items():
        response[key] = value
    return response


def _only_post() -> JsonResponse:
    # No standalone SSE stream: every answer comes on the POST that asked for it.
    refusal = RpcError(mcp_types.INVALID_REQUEST, "POST JSON-RPC requests")
    return _json(error_message(None, refusal), 405, Allow="POST")


def _unauthorized(request: HttpRequest) -> JsonResponse:
    return _json(error_message(request_id_of(request.body), unauthorized()), 401, **{"WWW-Authenticate": "Bearer"})


def _checked(call: Call, headers) -> bool:
    """True for a notification (answered 202, nothing done) once its routing headers agree with it; a request's
    headers, its method (no initialize: 2026-07-28 has none) and its _meta are checked, RpcError if not."""
    check_headers(call, headers)
    if call.is_notification:
        return True
    if call.method == "initialize":
        raise RpcError(
            mcp_types.UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version: this server speaks 2026-07-28 (server/discover), without initialize",
            {"supported": [calls.wire.PROTOCOL_VERSION]},
            http_status=400,
        )
    check_meta(call)
    return False


def _error_answer(call_id, error: Exception, endpoint: Endpoint) -> JsonResponse:
    """The JSON-RPC error for what a call raised: its own, or (logged, inside the except that caught it) an internal
    error that says nothing more."""
    if isinstance(error, RpcError):
        return _json(error_message(call_id, error), error.http_status)
    logger.exception("gateway: %s failed", endpoint.server_name or "/mcp")
    return _json(error_message(call_id, RpcError(mcp_types.INTERNAL_ERROR, "Internal error")), 500)


@csrf_exempt
def server_endpoint_at_once(request: HttpRequest, name: str) -> HttpResponse:
    return _serve_at_once(request, Endpoint(server_name=name))


@csrf_exempt
def aggregate_endpoint_at_once(request: HttpRequest) -> HttpResponse:
    return _serve_at_once(request, Endpoint())


def _serve_at_once(request: HttpRequest, endpoint: Endpoint) -> HttpResponse:
    """A request whose `Mcp-Method` header names a method answered from one read (`tasks/get` …:
    request_threads.ANSWERED_AT_ONCE), served by a sync view (taskhub/urls_at_once.py) on the request's kept thread:
    the token, the call and its answer in the one trip a page's request takes, not one trip each. The same answers
    as _serve's: a body whose method differs from the header is refused by check_headers, so nothing that waits gets
    here."""
    if request.method != "POST":
        return _only_post()
    user = _bearer_user(request)
    if user is None:
        return _unauthorized(request)
    call_id = None
    try:
        call = parse_call(request.body)
        call_id = call.id
        if _checked(call, request.headers):
            return HttpResponse(status=202)
        handler = SYNC_METHODS.get(call.method)
        if handler is None:
            raise method_not_found(call.method)
        result = handler(endpoint, user, call)
    except Exception as error:
        return _error_answer(call_id, error, endpoint)
    return _json(result_message(call.id, result))


async def _serve(request: HttpRequest, endpoint: Endpoint) -> HttpResponse:
    if request.method != "POST":
        return _only_post()
    call_id = None
    refusal = None
    try:
        call = parse_call(request.body)
        call_id = call.id
        notification = _checked(call, request.headers)
    except Exception as error:
        refusal = _error_answer(call_id, error, endpoint)  # answered once the token is found good
    else:
        if not notification and call.method == "tools/call":
            return await _call_tool(request, endpoint, call)
    user = await waiting.in_turn(_bearer_user, request)
    if user is None:
        return _unauthorized(request)
    if refusal is not None:
        return refusal
    if notification:
        return HttpResponse(status=202)
    try:
        if call.method == "subscriptions/listen":
            return await _listen(endpoint, user, call)
        result = await _dispatch(endpoint, user, call)
    except Exception as error:
        return _error_answer(call_id, error, endpoint)
    return _json(result_message(call.id, result))


async def _dispatch(endpoint: Endpoint, user, call: Call) -> dict:
    handler = SYNC_METHODS.get(call.method)
    if handler is None:
        raise method_not_found(call.method)  # tasks/result and tasks/list among them: removed by the extension
    return await waiting.in_turn(handler, endpoint, user, call)


async def _call_tool(request: HttpRequest, endpoint: Endpoint, call: Call) -> HttpResponse:
    """A `tools/call`: its token checked, a slot taken and the call launched in one trip to the gateway's pool
    (_launch_for_token), then its outcome waited for and answered."""
    trip = asyncio.ensure_future(waiting.in_turn(_launch_for_token, request, endpoint, call))
    try:
        launching = await asyncio.shield(trip)
    except asyncio.CancelledError:
        trip.add_done_callback(_release_unclaimed_slot)  # the agent left: the slot is given back once launched
        raise
    except Exception as error:
        return _error_answer(call.id, error, endpoint)
    if launching is None:
        return _unauthorized(request)
    user, slot, launched = launching
    try:
        with slot:
            result = await _launch_answer(launched, user)
    except Exception as error:
        return _error_answer(call.id, error, endpoint)
    return _json(result_message(call.id, result))


def _launch_for_token(request: HttpRequest, endpoint: Endpoint, call: Call) -> tuple | None:
    """(the token's user, its slot, the launch), or None: no valid token (401, nothing done). One trip to the
    gateway's pool for the token and the launch, where each took one of its own: a thread hop there and back less,
    0.2-0.3 ms of a quick call (bench/gateway.py --baseline-tree, 300 calls). The slot is taken before the launch:
    past the cap nothing is recorded."""
    user = _bearer_user(request)
    if user is None:
        return None
    slot = waiting.take_slot(user.api_token.pk)
    try:
        return user, slot, calls.call_tool(endpoint, user, call)
    except BaseException:
        slot.release()
        raise


def _release_unclaimed_slot(trip: asyncio.Future) -> None:
    if not trip.cancelled() and trip.exception() is None and trip.result() is not None:
        trip.result()[1].release()


async def _launch_answer(launched: calls.Launched, user) -> dict:
    if launched.told is not None:
        recorded = await _wait_for_own_send(launched)
        if recorded is not None and (completed := calls.completed_answer(recorded)) is not None:
            return completed  # the result, as recorded: nothing to read again
    else:
        await _wait_for_launch(launched)
    return await waiting.in_turn(calls.call_answer, launched, user)


def _launch_wait(launched: calls.Launched) -> float:
    """How long a tools/call waits for its launch's outcome: for the task (an agent with the Tasks extension), or for
    the result (one without)."""
    if launched.declared:
        return settings.TASKHUB_GATEWAY_LAUNCH_WAIT_SECONDS
    return settings.TASKHUB_GATEWAY_SYNC_WAIT_SECONDS


async def _wait_for_own_send(launched: calls.Launched) -> Task | None:
    """Until the call the gateway sends itself is answered and recorded (the task as recorded, when its service
    returned it), or the wait runs out (None: the agent gets the task, and the call goes on being sent and recorded;
    the agent leaving does not cut it short either)."""
    assert launched.told is not None
    told = asyncio.wrap_future(launched.told)
    try:
        return await asyncio.wait_for(asyncio.shield(told), _launch_wait(launched))
    except TimeoutError:
        return None


async def _wait_for_launch(launched: calls.Launched) -> None:
    """Until the worker recorded the launch's outcome, or the wait runs out (then the agent gets the task). Woken
    by the task's changes; past a moment it holds neither the request's thread nor a database connection."""
    wait = _launch_wait(launched)
    deadline = time.monotonic() + wait
    async with waiting.Wakeups([launched.task_id]) as wakeups:
        # Joined first: a change committed between the first look and the wait still wakes it.
        if await waiting.in_turn(calls.launch_settled, launched) or wait <= 0:
            return
        # The request's thread keeps its connection for the answer (call_answer): a quick tool's outcome comes within
        # milliseconds, and a new connection cost more than the rest of its answer. A longer wait holds neither: the
        # thread exits after a moment with nothing to do, closing its connection (IdleExitingExecutor).
        settled = waiting.on_gateway_thread(calls.launch_settled)
        # A process without a layer shared with the worker's is woken by nothing: it looks again after 1, 2, 4 … s.
        safety_net = waiting.WAIT_SAFETY_NET_FIRST_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            messages = await wakeups.wait(min(left, safety_net))
            if not messages:
                safety_net = min(safety_net * 2, waiting.SAFETY_NET_SECONDS)
            if await settled(launched):
                return


async def _listen(endpoint: Endpoint, user, call: Call) -> StreamAfterRequest:
    """`subscriptions/listen` as an SSE stream: the acknowledgement, each granted task as it is now, then
    `notifications/tasks` on each change of one and `notifications/tools/list_changed` on a change of the tool list;
    it ends (the listen request's result) once every task listened to has ended, after
    TASKHUB_GATEWAY_LISTEN_SECONDS, or when the process's channel-layer hub is lost (the agent listens again).
    Woken by the channel layer or the process's safety net (waiting.py); it reads Postgres only then, the task that
    changed (once for every stream woken by that change), on the gateway's pool. Sent after Django has finished the
    request (StreamAfterRequest), so an idle stream holds only what `_stream_events` keeps."""
    slot = waiting.take_slot(user.api_token.pk)
    try:
        subscription = await waiting.in_turn(calls.subscribe, endpoint, user, call)
    except BaseException:
        slot.release()
        raise
    # The stream keeps the token's id, not the user: it reads them afresh when their access or tools may have changed.
    events = _stream_events(endpoint, user.pk, user.api_token.pk, call.id, subscription)
    response = StreamAfterRequest(events, on_end=slot.release, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response


_read_state = waiting.on_gateway_thread(calls.subscription_state)
_read_task = waiting.on_gateway_thread(calls.listened_task)
_stream_refusal = waiting.on_gateway_thread(calls.stream_refusal)


def _sse(message: dict) -> bytes:
    return f"event: message\ndata: {json.dumps(message)}\n\n".encode()


def _notification(method: str, params: dict, meta: dict) -> bytes:
    return _sse({"jsonrpc": "2.0", "method": method, "params": {**params, "_meta": meta}})


def _as_notified(task: dict) -> dict:
    return {key: value for key, value in task.items() if key != "resultType"}


def _seen(task: dict) -> tuple[str, int]:
    """What a stream keeps of a task it notified, rather than the task (memory per idle stream: bench/gateway.py
    --listen): its status, and a hash of the rest but lastUpdatedAt (a change of that alone is not notified)."""
    rest = {key: value for key, value in task.items() if key != "lastUpdatedAt"}
    return task["status"], hash(json.dumps(rest, sort_keys=True, default=str))


async def _read_task_seen(task_id: str) -> tuple[dict, tuple[str, int]] | None:
    """A listened task as read after a change, with what streams keep of it (_seen): made once for all the streams
    that share the read (waiting.read_once), not once per stream."""
    task = await _read_task(task_id)
    return None if task is None else (task, _seen(task))


async def _stream_events(endpoint: Endpoint, user_id: int, token_id: int, call_id, subscription: calls.Subscription):
    meta = {SUBSCRIPTION_ID: call_id}
    tools_of_user = user_id if subscription.tools else None
    wakeups = waiting.Wakeups(subscription.task_ids, tools_of_user=tools_of_user, access_of_user=user_id)
    async with wakeups:
        tools_seen, tasks = await _read_state(endpoint, token_id, subscription)
        tasks_seen = {task_id: _seen(task) for task_id, task in tasks.items()}
        # Acknowledged once the stream listens and has read what it compares changes with: every change an agent
        # makes or sees after the acknowledgement is notified (one made before the read was taken as the start).
        acknowledged = {"notifications": subscription.acknowledged()}
        yield _notification("notifications/subscriptions/acknowledged", acknowledged, meta)
        for task in tasks.values():
            yield _notification("notifications/tasks", _as_notified(task), meta)
        del tasks
        deadline = time.monotonic() + settings.TASKHUB_GATEWAY_LISTEN_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            if not subscription.tools and all(status in TERMINAL for status, _ in tasks_seen.values()):
                break
            # Woken by a change (the layer's, or the process's safety net: waiting.SafetyNet), or not at all.
            messages = await wakeups.wait(left)
            if not messages:
                continue
            if any(message.get("type") == HUB_LOST for message in messages):
                break
            if any(message.get("type") == ACCESS_CHANGED for message in messages):
                # The token revoked, its user deactivated or a role taken: the stream ends at once.
                refusal = await _stream_refusal(token_id)
                if refusal is not None:
                    yield _sse(error_message(call_id, refusal))
                    return
            # The tool list is read again only when access or a server's tools changed (or by the safety net).
            if any(message.get("type") != TASK_CHANGED for message in messages):
                tools_now, tasks = await _read_state(endpoint, token_id, subscription, tools=True)
                read = {task_id: (task, _seen(task)) for task_id, task in tasks.items()}
                tasks_seen = {task_id: seen for task_id, seen in tasks_seen.items() if task_id in read}  # deleted
            else:
                tools_now, read = tools_seen, {}
                changes = {m["task_id"]: m.get("message_id") for m in messages if m.get("task_id")}
                for task_id, message_id in changes.items():
                    if task_id not in tasks_seen:
                        continue
                    # The streams woken by one change read its task once between them.
                    task_seen = await waiting.read_once((task_id, message_id), lambda t=task_id: _read_task_seen(t))
                    if task_seen is not None:
                        read[task_id] = task_seen
            if tools_now != tools_seen:
                yield _notification("notifications/tools/list_changed", {}, meta)
            tools_seen = tools_now
            for task_id, (task, seen) in read.items():
                if seen != tasks_seen.get(task_id):
                    tasks_seen[task_id] = seen
                    yield _notification("notifications/tasks", _as_notified(task), meta)
            del read
    yield _sse(result_message(call_id, {"resultType": "complete", "_meta": meta}))
