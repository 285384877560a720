"""What each method of the gateway does, in sync code on the request's thread (the view awaits it). Writes go
through taskhub.tasks.services only: a call is a launch, an answer is answer_input, a cancel is request_cancel.
Nothing here sends a request to an upstream server: the worker does, from the jobs the services defer, or, for a
first call where nothing of the worker's is needed, the gateway's sender (taskhub/gateway/sending.py) once the
launch is committed."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import mcp_types
from django.conf import settings
from django.core import signing
from django.db import transaction
from django.utils import timezone

from taskhub.accounts import permissions
from taskhub.api.models import ApiToken
from taskhub.gateway import sending, wire_tasks
from taskhub.gateway.catalogue import Endpoint
from taskhub.gateway.protocol import (
    FORBIDDEN,
    UNAUTHORIZED,
    Call,
    RpcError,
    bounded,
    invalid_params,
    missing_tasks_extension,
    task_not_found,
)
from taskhub.mcp import wire
from taskhub.tasks import services
from taskhub.tasks.errors import AlreadyAnswered, InputNoLongerOpen, InvalidTransition, TaskError
from taskhub.tasks.models import GATE_METHOD, TASK_PHASE, InputRequestState, Task, TaskStatus

MRTR_STATE_SALT = "taskhub.gateway.mrtr"
MAX_INPUT_RESPONSES = 64
INSTRUCTIONS = (
    "taskhub gateway: every tools/call becomes a taskhub task that people can watch, approve and cancel; "
    "tasks/get, tasks/update and tasks/cancel are answered by taskhub."
)


def discover(endpoint: Endpoint) -> dict[str, Any]:
    name = "taskhub" if endpoint.aggregate else f"taskhub: {endpoint.server_name}"
    return {
        "resultType": "complete",
        "supportedVersions": [wire.PROTOCOL_VERSION],
        "capabilities": {"tools": {"listChanged": True}, "extensions": {wire.EXTENSION_ID: {}}},
        "instructions": INSTRUCTIONS,
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": name[:200], "version": "0.1.0"}},
    }


def list_tools(endpoint: Endpoint, user) -> dict[str, Any]:
    return {"resultType": "complete", "tools": endpoint.tools(user), "ttlMs": 0, "cacheScope": "private"}


# --- tools/call -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launched:
    """A call turned into a taskhub task; the view waits for its launch outcome past `after_round` (the MRTR round
    this call answered; 0 for a first call)."""

    task_id: uuid.UUID
    declared: bool
    after_round: int
    # The call the gateway sends itself (sending.py): done once its outcome is committed, or nothing more comes.
    told: concurrent.futures.Future | None = None


def call_tool(endpoint: Endpoint, user, call: Call) -> Launched:
    name = call.params.get("name")
    arguments = call.params.get("arguments")
    if not isinstance(name, str) or not name:
        raise invalid_params("params.name must be a tool name")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise invalid_params("params.arguments must be an object")
    target = endpoint.resolve(name)
    if target is None:
        raise invalid_params(f"Unknown tool: {name}")
    server, tool = target
    if not permissions.may_launch_through_token(user, server):
        raise RpcError(FORBIDDEN, f"{user.get_username()} may not launch tools on {server.name}", http_status=403)
    if "requestState" in call.params or "inputResponses" in call.params:
        return _answer_round(call, user=user, server=server, tool=tool)
    declared = call.declares_tasks
    terms = permissions.answer_terms(server_id=server.pk, tool=tool)
    if terms.gate_before_call and not declared:
        raise missing_tasks_extension()  # people approve first: that takes a task to wait on
    launching = {"server": server, "tool": tool, "arguments": arguments, "user": user, "token": agent_token(user)}
    # The gateway sends a call once its launch has committed: not from inside a caller's transaction (a test's).
    in_a_transaction = transaction.get_connection().in_atomic_block
    kept = None if terms.gate_before_call or in_a_transaction else sending.SENDER.take(server, declares_tasks=declared)
    if kept is None:
        try:
            task = services.launch(**launching, declares_tasks=declared)
        except TaskError as refused:
            raise invalid_params(str(refused)) from None
        return Launched(task_id=task.id, declared=declared, after_round=0)

    return _launch_and_send(kept, launching, declared=declared)


def _launch_and_send(kept: sending.KeptClient, launching: dict[str, Any], *, declared: bool) -> Launched:
    """The launch marked sent by the gateway, and its call sent on the `kept` client as the launch commits,
    while the commit's other hooks (the live pages' publish) run."""
    told: list[concurrent.futures.Future] = []

    def start_sending(launched: tuple[Task, bool]) -> None:
        task, sends = launched
        if sends:
            told.append(sending.SENDER.send(kept, task=task, tools=launching["server"].tools))

    try:
        task, sends = sending.committed_first(
            start_sending,
            services.launch_sent_by_gateway,
            **launching,
            declares_tasks=declared,
            answer_within=kept.timeout,
        )
    except BaseException as error:
        sending.SENDER.give_back(kept)
        if isinstance(error, TaskError):
            raise invalid_params(str(error)) from None
        raise
    if not sends:  # the gate held it for people after all (its policy changed meanwhile)
        sending.SENDER.give_back(kept)
        return Launched(task_id=task.id, declared=declared, after_round=0)
    return Launched(task_id=task.id, declared=declared, after_round=0, told=told[0])


def stream_refusal(token_id: int) -> RpcError | None:
    """Why a stream opened with this token must end now (None: it may go on): the token revoked or expired, its
    user deactivated, or no longer an agent or operator (who use the gateway). Read afresh, not from the request."""
    token = ApiToken.objects.select_related("user").filter(pk=token_id).first()
    if token is None or token.revoked_at is not None:
        why = "the API token was revoked"
    elif token.expires_at is not None and token.expires_at <= timezone.now():
        why = "the API token expired"
    elif not token.user.is_active:
        why = "the token's user was deactivated"
    elif not permissions.launches_through_token(token.user):
        why = "the token's user is no longer an agent or an operator"
    else:
        return None
    return RpcError(UNAUTHORIZED, f"Unauthorized: {why}; the stream ends", http_status=401)


def agent_token(user):
    """The API token the call came with (views._bearer_user), recorded by the services as the agent."""
    return getattr(user, "api_token", None)


def user_carrying(token):
    """The token's user, carrying the token as `api_token` (what agent_token reads)."""
    user = token.user
    user.api_token = token
    return user


def mrtr_state(task: Task, mrtr_round: int, user) -> str:
    return signing.dumps({"task": str(task.id), "round": mrtr_round, "user": user.pk}, salt=MRTR_STATE_SALT)


def _answer_round(call: Call, *, user, server, tool: str) -> Launched:
    """An MRTR retry: the agent's answers to the round the gateway passed through become answers of the task's
    requests (audited as the agent's), and the worker resends tools/call with them."""
    try:
        state = signing.loads(str(call.params.get("requestState") or ""), salt=MRTR_STATE_SALT)
        task_id, mrtr_round = uuid.UUID(state["task"]), int(state["round"])
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise invalid_params("requestState is not one this gateway issued") from None
    if state.get("user") != user.pk:
        raise invalid_params("requestState is not one this gateway issued")
    task = Task.objects.filter(pk=task_id, launched_by=user, server=server, tool=tool).first()
    if task is None:
        raise invalid_params("requestState names no task of this tool")
    if wire_tasks.people_answer(task) is not None:
        raise invalid_params("The approvers of this tool answer its requests, in taskhub's inbox")
    responses = call.params.get("inputResponses")
    if not isinstance(responses, dict) or len(responses) > MAX_INPUT_RESPONSES:
        raise invalid_params("inputResponses must be an object of answers")
    requests = wire_tasks.open_requests(task, mrtr_round=mrtr_round)
    missing = [request.key for request in requests if request.key not in responses]
    if missing:
        raise invalid_params(f"inputResponses lacks an answer to {missing[0]!r}")
    for request in requests:
        _answer(request, responses[request.key], user=user)
    return Launched(task_id=task.id, declared=call.declares_tasks, after_round=mrtr_round)


def _answer(request, response: Any, *, user) -> None:
    if not isinstance(response, dict):
        raise invalid_params(f"inputResponses[{request.key!r}] must be an object")
    response = _only_fields_asked(request, response)
    try:
        with transaction.atomic():  # the request read locked, answered and, where it can, sent as this commits
            sending.answer_and_send(
                input_request=services.locked_for_answer(input_request_id=request.pk),
                response=response,
                user=user,
                as_agent=True,
                token=agent_token(user),
            )
    except (AlreadyAnswered, InputNoLongerOpen):
        pass  # answered meanwhile (in the inbox) or no longer asked: the spec has such answers ignored
    except TaskError as refused:
        raise invalid_params(f"inputResponses[{request.key!r}]: {refused}") from None


def _only_fields_asked(request, response: dict[str, Any]) -> dict[str, Any]:
    """An agent's form answer without the fields the form did not ask for: they are dropped, never forwarded (the
    inbox's forms cannot send them either), where the answer service would refuse the whole answer."""
    schema = request.params.get("requestedSchema") if isinstance(request.params, dict) else None
    properties = schema.get("properties") if isinstance(schema, dict) else None
    content = response.get("content")
    if request.method != "elicitation/create" or not isinstance(properties, dict) or not isinstance(content, dict):
        return response
    return {**response, "content": {key: value for key, value in content.items() if key in properties}}


def launch_settled(launched: Launched) -> bool:
    """Whether the launch has an outcome the call can answer with (asked when the task changed; Postgres only)."""
    task = Task.objects.filter(pk=launched.task_id).first()
    if task is None or task.is_terminal or task.status == TaskStatus.LAUNCH_UNKNOWN:
        return True
    newer_round = task.input_requests.filter(mrtr_round__gt=launched.after_round, state=InputRequestState.OPEN)
    if task.remote_task_id is None and newer_round.exclude(method=GATE_METHOD).exists():
        return True  # MRTR input
    if not launched.declared:
        return False  # a caller without the extension waits for the result
    gated = task.input_requests.filter(method=GATE_METHOD, state=InputRequestState.OPEN).exists()
    return task.remote_task_id is not None or gated


def call_answer(launched: Launched, user) -> dict[str, Any]:
    """What tools/call answers once the launch settled (or the wait ran out): upstream's complete result or error,
    its MRTR input requests when the agent answers them, else the task."""
    task = Task.objects.select_related("server").get(pk=launched.task_id)
    if (completed := completed_answer(task)) is not None:
        return completed
    if task.remote_task_id is None:
        if task.status == TaskStatus.FAILED and _upstream_error(task):
            error = wire_tasks.error_of(task)
            raise RpcError(error["code"], bounded(error["message"]), error.get("data"))
        if task.status == TaskStatus.INPUT_REQUIRED and wire_tasks.people_answer(task) is None:
            latest = task.input_requests.exclude(method=GATE_METHOD).order_by("-mrtr_round").first()
            if latest is not None and latest.mrtr_round > TASK_PHASE:
                requests = wire_tasks.open_requests(task, mrtr_round=latest.mrtr_round)
                if requests:
                    return {
                        "resultType": "input_required",
                        "inputRequests": wire_tasks.as_input_requests(requests),
                        "requestState": mrtr_state(task, latest.mrtr_round, user),
                    }
    if launched.declared:
        return wire_tasks.create_task_result(task)
    if task.is_terminal or task.status == TaskStatus.LAUNCH_UNKNOWN:
        status, message, fields = wire_tasks.status_of(task)
        error = fields.get("error") or {"code": mcp_types.INTERNAL_ERROR, "message": message or status}
        raise RpcError(error["code"], bounded(error["message"]), error.get("data"))
    raise RpcError(
        mcp_types.INTERNAL_ERROR,
        f"No result within {settings.TASKHUB_GATEWAY_SYNC_WAIT_SECONDS} s; the call goes on as taskhub task {task.id}"
        " (declare the Tasks extension to follow it).",
    )


def completed_answer(task: Task) -> dict[str, Any] | None:
    """What tools/call answers when the call was answered with its result (no task), read off the task alone."""
    if task.remote_task_id is not None or task.status != TaskStatus.COMPLETED:
        return None
    result = task.result if isinstance(task.result, dict) else {"content": [], "isError": False}
    return {"resultType": "complete", **result}


def _upstream_error(task: Task) -> bool:
    """A JSON-RPC error the server answered tools/call with (passed through as the call's error)."""
    return isinstance(task.error, dict) and isinstance(task.error.get("code"), int)


# --- tasks/* ------------------------------------------------------------------------------------------------


def _task_of(endpoint: Endpoint, user, call: Call) -> Task:
    if not call.declares_tasks:
        raise missing_tasks_extension()
    task_id = call.params.get("taskId")
    if not isinstance(task_id, str):
        raise invalid_params("params.taskId must be a string")
    try:
        pk = uuid.UUID(task_id)
    except ValueError:
        raise task_not_found() from None
    tasks = Task.objects.select_related("server").filter(pk=pk, launched_by=user)
    if not endpoint.aggregate:
        tasks = tasks.filter(server__name=endpoint.server_name)
    try:
        return tasks.get()  # the primary key: no ORDER BY to compile and sort by, as first() would add
    except Task.DoesNotExist:
        raise task_not_found() from None


def get_task(endpoint: Endpoint, user, call: Call) -> dict[str, Any]:
    return wire_tasks.detailed_task(_task_of(endpoint, user, call))


def update_task(endpoint: Endpoint, user, call: Call) -> dict[str, Any]:
    """The agent's answers: each to an open request it was shown goes through answer_input (audited as the agent's
    answer, sent on the gateway's kept client where it can, else by the delivery job: sending.answer_and_send);
    keys not outstanding are ignored, as the spec asks."""
    task = _task_of(endpoint, user, call)
    responses = call.params.get("inputResponses")
    if not isinstance(responses, dict) or len(responses) > MAX_INPUT_RESPONSES:
        raise invalid_params("params.inputResponses must be an object of answers")
    if wire_tasks.people_answer(task) is None:
        outstanding = {request.key: request for request in wire_tasks.open_requests(task)}
        for key, response in responses.items():
            if key in outstanding:
                _answer(outstanding[key], response, user=user)
    return {"resultType": "complete"}


def cancel_task(endpoint: Endpoint, user, call: Call) -> dict[str, Any]:
    task = _task_of(endpoint, user, call)
    # Finished, or its launch outcome unknown (failed, to the agent): acknowledged all the same.
    with contextlib.suppress(InvalidTransition):
        services.request_cancel(task=task, user=user, token=agent_token(user))
    return {"resultType": "complete"}


# --- subscriptions/listen ---------------------------------------------------------------------------------------

MAX_LISTENED_TASKS = 256


@dataclass(frozen=True)
class Subscription:
    """What a `subscriptions/listen` was granted: the tool list's changes, and these tasks (the agent's own)."""

    tools: bool
    task_ids: tuple[uuid.UUID, ...]

    def acknowledged(self) -> dict[str, Any]:
        granted: dict[str, Any] = {}
        if self.tools:
            granted["toolsListChanged"] = True
        if self.task_ids:
            granted["taskIds"] = [str(task_id) for task_id in self.task_ids]
        return granted


def subscribe(endpoint: Endpoint, user, call: Call) -> Subscription:
    wanted = call.params.get("notifications")
    if not isinstance(wanted, dict):
        raise invalid_params("params.notifications must be an object")
    asked_ids = wanted.get("taskIds")
    task_ids: list[uuid.UUID] = []
    if asked_ids is not None:
        if not call.declares_tasks:
            raise missing_tasks_extension()
        if not isinstance(asked_ids, list) or len(asked_ids) > MAX_LISTENED_TASKS:
            raise invalid_params(f"notifications.taskIds must be a list of at most {MAX_LISTENED_TASKS} task ids")
        for value in asked_ids:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                task_ids.append(uuid.UUID(value))
        visible = Task.objects.filter(pk__in=task_ids, launched_by=user)
        if not endpoint.aggregate:
            visible = visible.filter(server__name=endpoint.server_name)
        known = set(visible.values_list("pk", flat=True))
        task_ids = [task_id for task_id in dict.fromkeys(task_ids) if task_id in known]  # unknown ones are not granted
    return Subscription(tools=wanted.get("toolsListChanged") is True, task_ids=tuple(task_ids))


def listened_task(task_id: str) -> dict[str, Any] | None:
    """One task listened to, as `tasks/get` shows it (the same for every agent granted it); None once deleted."""
    task = Task.objects.select_related("server").filter(pk=task_id).first()
    return wire_tasks.detailed_task(task) if task is not None else None


def subscription_state(
    endpoint: Endpoint, token_id: int, subscription: Subscription, *, tools: bool = True
) -> tuple[str, dict[str, dict[str, Any]]]:
    """(a fingerprint of the tool list the token's user sees now, or "" when not listened to or not asked for
    (`tools`); each listened task as `tasks/get` shows it)."""
    user = _user_of_token(token_id) if subscription.tools and tools else None
    tools = json.dumps(endpoint.tools(user), sort_keys=True, default=str) if user is not None else ""
    tasks = Task.objects.select_related("server").filter(pk__in=subscription.task_ids)
    return hashlib.sha256(tools.encode()).hexdigest() if tools else "", {
        str(task.pk): wire_tasks.detailed_task(task) for task in tasks
    }


def _user_of_token(token_id: int):
    """The token's user, carrying the token (as views._bearer_user's), read afresh; None once the token is gone."""
    token = ApiToken.objects.select_related("user").filter(pk=token_id).first()
    return None if token is None else user_carrying(token)
