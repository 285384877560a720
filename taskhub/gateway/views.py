"""The gateway's endpoints: `/mcp/servers/<name>` and `/mcp`, JSON-RPC over Streamable HTTP (stateless, 2026-07-28).

Async views: a `tools/call` waits for its launch outcome (polling the task's row, a few times a second, without
holding a thread), and everything else is one short piece of sync code (calls.py) on the request's thread. Without a
valid API token nothing is read or written but the token lookup: HTTP 401 with a JSON-RPC error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import mcp_types
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from taskhub.api.tokens import active_token
from taskhub.gateway import calls
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

logger = logging.getLogger(__name__)

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
# How often an open subscriptions/listen looks for changes (Postgres: the listened tasks' rows, the catalogue).
LISTEN_CHECK_SECONDS = 0.5
# How often a waiting tools/call looks at its task's row.
SETTLE_CHECK_SECONDS = 0.05
SETTLE_CHECK_MAX_SECONDS = 0.25

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
    if token is None:
        return None
    user = token.user
    user.api_token = token
    return user


def _json(message: dict, status: int = 200, **headers: str) -> JsonResponse:
    response = JsonResponse(message, status=status)
    for key, value in headers.items():
        response[key] = value
    return response


async def _serve(request: HttpRequest, endpoint: Endpoint) -> HttpResponse:
    if request.method != "POST":
        # No standalone SSE stream: every answer comes on the POST that asked for it.
        return _json(
            error_message(None, RpcError(mcp_types.INVALID_REQUEST, "POST JSON-RPC requests")), 405, Allow="POST"
        )
    user = await sync_to_async(_bearer_user)(request)
    if user is None:
        refusal = unauthorized()
        return _json(error_message(request_id_of(request.body), refusal), 401, **{"WWW-Authenticate": "Bearer"})
    call_id = None
    try:
        call = parse_call(request.body)
        call_id = call.id
        check_headers(call, request.headers)
        if call.is_notification:
            return HttpResponse(status=202)
        if call.method == "initialize":
            raise RpcError(
                mcp_types.UNSUPPORTED_PROTOCOL_VERSION,
                "Unsupported protocol version: this server speaks 2026-07-28 (server/discover), without initialize",
                {"supported": [calls.wire.PROTOCOL_VERSION]},
                http_status=400,
            )
        check_meta(call)
        if call.method == "subscriptions/listen":
            return await _listen(endpoint, user, call)
        result = await _dispatch(endpoint, user, call)
    except RpcError as error:
        return _json(error_message(call_id, error), error.http_status)
    except Exception:
        logger.exception("gateway: %s failed", endpoint.server_name or "/mcp")
        error = RpcError(mcp_types.INTERNAL_ERROR, "Internal error")
        return _json(error_message(call_id, error), 500)
    return _json(result_message(call.id, result))


async def _dispatch(endpoint: Endpoint, user, call: Call) -> dict:
    if call.method == "tools/call":
        launched = await sync_to_async(calls.call_tool)(endpoint, user, call)
        await _wait_for_launch(launched)
        return await sync_to_async(calls.call_answer)(launched, user)
    handler = SYNC_METHODS.get(call.method)
    if handler is None:
        raise method_not_found(call.method)  # tasks/result and tasks/list among them: removed by the extension
    return await sync_to_async(handler)(endpoint, user, call)


async def _wait_for_launch(launched: calls.Launched) -> None:
    """Until the worker recorded the launch's outcome, or the wait runs out (then the agent gets the task)."""
    wait = (
        settings.TASKHUB_GATEWAY_LAUNCH_WAIT_SECONDS
        if launched.declared
        else settings.TASKHUB_GATEWAY_SYNC_WAIT_SECONDS
    )
    deadline = time.monotonic() + wait
    pause = SETTLE_CHECK_SECONDS
    while not await sync_to_async(calls.launch_settled)(launched):
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, SETTLE_CHECK_MAX_SECONDS)


async def _listen(endpoint: Endpoint, user, call: Call) -> StreamingHttpResponse:
    """`subscriptions/listen` as an SSE stream: the acknowledgement, each granted task as it is now, then
    `notifications/tasks` on each change of one and `notifications/tools/list_changed` on a change of the tool list,
    read from Postgres; it ends (the listen request's result) once every task listened to has ended, or after
    TASKHUB_GATEWAY_LISTEN_SECONDS."""
    subscription = await sync_to_async(calls.subscribe)(endpoint, user, call)
    meta = {SUBSCRIPTION_ID: call.id}
    state = sync_to_async(calls.subscription_state)

    def notification(method: str, params: dict) -> bytes:
        message = {"jsonrpc": "2.0", "method": method, "params": {**params, "_meta": meta}}
        return f"event: message\ndata: {json.dumps(message)}\n\n".encode()

    def as_notified(task: dict) -> dict:
        return {key: value for key, value in task.items() if key != "resultType"}

    def comparable(task: dict | None) -> dict | None:
        return None if task is None else {key: value for key, value in task.items() if key != "lastUpdatedAt"}

    async def events():
        yield notification("notifications/subscriptions/acknowledged", {"notifications": subscription.acknowledged()})
        tools_seen, tasks_seen = await state(endpoint, user, subscription)
        for task in tasks_seen.values():
            yield notification("notifications/tasks", as_notified(task))
        deadline = time.monotonic() + settings.TASKHUB_GATEWAY_LISTEN_SECONDS
        while time.monotonic() < deadline:
            if not subscription.tools and all(task["status"] in TERMINAL for task in tasks_seen.values()):
                break
            await asyncio.sleep(LISTEN_CHECK_SECONDS)
            tools_now, tasks_now = await state(endpoint, user, subscription)
            if tools_now != tools_seen:
                yield notification("notifications/tools/list_changed", {})
            for task_id, task in tasks_now.items():
                if comparable(task) != comparable(tasks_seen.get(task_id)):
                    yield notification("notifications/tasks", as_notified(task))
            tools_seen, tasks_seen = tools_now, tasks_now
        ended = result_message(call.id, {"resultType": "complete", "_meta": meta})
        yield f"event: message\ndata: {json.dumps(ended)}\n\n".encode()

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response
