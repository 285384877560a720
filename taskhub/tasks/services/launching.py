"""Launching a tool call: the task written before anything is sent, and what tools/call answered."""

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from taskhub.accounts import permissions
from taskhub.audit.models import agent_label
from taskhub.audit.services import GATEWAY, agent_facts, audit_event, record_events, storable
from taskhub.mcp import schema_fields
from taskhub.mcp.client import CallOutcome, TaskCreated, ToolCompleted, ToolInputRequired
from taskhub.servers.catalogue import find_tool
from taskhub.servers.hooks import job_queue
from taskhub.servers.models import Server
from taskhub.tasks import hooks, storable_text
from taskhub.tasks.errors import (
    ArgumentsRejected,
    InvalidTransition,
    LaunchRefused,
    UnknownTool,
)
from taskhub.tasks.models import (
    LIVE_STATUSES,
    TASK_PHASE,
    InputRequest,
    Task,
    TaskPoll,
    TaskStatus,
)
from taskhub.tasks.services.common import _finished, _locked, _publish_after_commit
from taskhub.tasks.services.delivering import _mark_delivered
from taskhub.tasks.services.following import _open_requests, _record_problems, _supersede_open_requests, snapshot_values
from taskhub.tasks.services.gate import _gate
from taskhub.tasks.services.sending import _reset_launch_attempts, record_launch_end


def check_launch(*, server: Server, tool: str, arguments: Any) -> None:
    """Raise LaunchRefused unless `tool` is in the server's discovered catalogue and `arguments` fit its
    inputSchema. `launch` calls it; a form that could not read some fields asks it about the others."""
    entry = find_tool(server, tool)
    if entry is None:
        raise UnknownTool(
            f"The server {server.name} has no tool {tool[:200]!r} in its catalogue (discover it again if it is new)."
        )
    if entry.header_problem:
        raise LaunchRefused(
            f"The tool {tool[:200]!r} cannot be launched: the server {server.name} describes it with invalid "
            f"x-mcp-header annotations ({entry.header_problem}), and a client must not call such a tool."
        )
    # Unstorable text first: a lone surrogate would also fail the schema's checks, with a message that hides why.
    unstorable = storable_text.unstorable_fields(arguments) if isinstance(arguments, dict) else {}
    if unstorable:
        raise ArgumentsRejected("The arguments contain text that cannot be stored:", unstorable)
    errors = schema_fields.validate(entry.input_schema, arguments, schema_fields.TOOL)
    if errors:
        raise LaunchRefused("The arguments do not fit the tool's input schema:", errors)


@transaction.atomic
def launch(
    *, server: Server, tool: str, arguments: dict[str, Any], user, token=None, declares_tasks: bool = True
) -> Task:
    """Write the task before anything is sent, so a crash can never lose a launched call unnoticed.

    Only a tool of the server's catalogue, with arguments that fit its inputSchema (LaunchRefused if not). `token`: the
    API token (an agent) `user` launched it with, kept on the task and in its audit rows. `declares_tasks=False`:
    tools/call goes without the Tasks extension (the gateway, for an agent without it).
    """
    task, terms, server = _write_launch(server=server, tool=tool, arguments=arguments, user=user, token=token)
    if terms.gate_before_call:
        _gate(task, terms=terms)
    else:
        hooks.enqueue_launch(task.id, queue=job_queue(server), declares_tasks=declares_tasks)
    _publish_after_commit(task.id, server_id=server.pk, asks=terms.gate_before_call)  # the gate asks people
    return task


# How long after the gateway's call could have been answered (its timeout) the fallback job looks at it.
GATEWAY_FALLBACK_MARGIN_SECONDS = 60.0


@transaction.atomic
def launch_sent_by_gateway(
    *,
    server: Server,
    tool: str,
    arguments: dict[str, Any],
    user,
    token=None,
    declares_tasks: bool = True,
    answer_within: float,
) -> tuple[Task, bool]:
    """A launch whose first tools/call the gateway sends itself once this commits (taskhub/gateway/sending.py): (the
    task, whether the gateway is to send it). False: the gate holds the call for people first, as `launch` does.

    The round is marked sent here (its `task.launch_sent` row), and the launch job is deferred to run only once
    `answer_within` (the call's timeout) and a margin have passed: should the gateway stop before it records what came
    back, the job finds the marker and makes the outcome unknown, as after a worker that stopped. The gateway's record
    of the outcome drops that job (`sent_by_gateway=True`).

    `server` is the gateway's, read for this call a moment before (its endpoint's resolve): not read again, as
    `launch` reads a caller's copy that may be stale. An unlocked read again would not keep it from being disabled
    meanwhile either; it cost a statement and about 0.8 ms of every quick call (bench/gateway.py)."""
    task, terms, server = _write_launch(
        server=server, tool=tool, arguments=arguments, user=user, token=token, gateway_sends=True
    )
    if terms.gate_before_call:
        _gate(task, terms=terms)
        _publish_after_commit(task.id, server_id=server.pk, asks=True)
        return task, False
    hooks.enqueue_launch(
        task.id,
        queue=job_queue(server),
        declares_tasks=declares_tasks,
        not_before_seconds=answer_within + GATEWAY_FALLBACK_MARGIN_SECONDS,
    )
    _publish_after_commit(task.id, server_id=server.pk, asks=False)
    return task, True


def _write_launch(
    *,
    server: Server,
    tool: str,
    arguments: dict[str, Any],
    user,
    token,
    gateway_sends: bool = False,
) -> tuple[Task, permissions.AnswerTerms, Server]:
    """The task and its `task.launched` row. With `gateway_sends` (launch_sent_by_gateway): `server` as the gateway
    read it a moment before, not read again, and, unless the gate holds the call, its first round marked sent by the
    gateway (`task.launch_sent`) in the same statement as that row."""
    if not gateway_sends:
        server = Server.objects.get(pk=server.pk)  # the caller's copy may be stale
    if server.removed_at is not None:
        raise InvalidTransition(f"The server {server.name!r} was removed; its tools cannot be launched any more.")
    if not server.enabled:
        raise InvalidTransition(f"The server {server.name!r} is disabled; enable it before launching tools on it.")
    check_launch(server=server, tool=tool, arguments=arguments)
    terms = permissions.answer_terms(server_id=server.pk, tool=tool)
    task = Task.objects.create(
        server=server,
        tool=tool,
        arguments=arguments,
        launched_by=user,
        launched_via_token=token,
        launched_via_label=agent_label(agent_facts(token)) if token is not None else "",
    )
    launched = {"tool": tool, "arguments": arguments, "server": server.name}
    events = [audit_event(action="task.launched", user=user, task=task, server=server, data=launched, token=token)]
    if gateway_sends and not terms.gate_before_call:
        events.append(audit_event(action="task.launch_sent", actor_label=GATEWAY, task=task, data={"mrtr_round": 0}))
    record_events(*events)
    return task, terms, server


@transaction.atomic
def record_launch_outcome(
    *,
    task: Task,
    outcome: CallOutcome,
    answered_request_ids: Iterable[int] = (),
    follower: str = "",
    sent_by_gateway: bool = False,
) -> Task:
    """What tools/call answered: a result, MRTR input requests, or a durable task to follow.

    `answered_request_ids`: the answers an MRTR retry carried; the server's answer to it is their delivery.
    `follower`: the worker that follows a 2025-11-25 task on its session (`outcome.on_session`); the tracker
    follows the others. `sent_by_gateway`: the gateway sent the call (launch_sent_by_gateway), and its fallback job
    is dropped."""
    task = _locked(task)
    if task.status != TaskStatus.LAUNCHING:
        raise InvalidTransition(f"Task {task.id} is {task.get_status_display()}, not launching; its outcome is known.")
    now = timezone.now()
    data: dict[str, Any]
    problems: list[str] = []
    if isinstance(outcome, ToolCompleted):
        task.status = TaskStatus.COMPLETED
        task.result = storable(outcome.result)
        task.finished_at = now
        task.mrtr_request_state = None
        data = {"outcome": "complete", "is_error": outcome.is_error}
    elif isinstance(outcome, ToolInputRequired):
        task.status = TaskStatus.INPUT_REQUIRED
        task.mrtr_request_state = outcome.request_state
        data = {"outcome": "input_required", "keys": sorted(outcome.input_requests)[:100]}
    elif isinstance(outcome, TaskCreated):
        snapshot = outcome.task
        task.remote_task_id = snapshot.task_id
        task.mrtr_request_state = None
        for field, value in snapshot_values(snapshot, task, problems=problems).items():
            setattr(task, field, value)
        task.remote_last_updated_at = snapshot.last_updated_at or ""
        if task.is_terminal:
            task.finished_at = now
        data = {"outcome": "task", "remote_task_id": snapshot.task_id, "status": snapshot.status}
        if outcome.on_session:
            data["revision"] = "2025-11-25"
    else:
        raise TypeError(f"not a tools/call outcome: {outcome!r}")
    _reset_launch_attempts(task)
    task.save()
    record_launch_end(task, action="task.launch_answered", data=data, by_gateway=sent_by_gateway)

    if not sent_by_gateway:  # the gateway sends only a first round, never gated: no request of the task is open
        _supersede_open_requests(task, reason="the tool call moved on")
    if isinstance(outcome, ToolInputRequired):
        rounds_so_far = task.input_requests.aggregate(last=Max("mrtr_round"))["last"] or 0
        _open_requests(task, outcome.input_requests, mrtr_round=rounds_so_far + 1, problems=problems)
    elif isinstance(outcome, TaskCreated):
        _open_requests(task, outcome.task.input_requests or {}, mrtr_round=TASK_PHASE, problems=problems)
        if task.status in LIVE_STATUSES and outcome.on_session:
            task.followed_by = follower
            task.save(update_fields=["followed_by"])
        elif task.status in LIVE_STATUSES:
            TaskPoll.objects.create(task=task, next_poll_at=now)
    _record_problems(task, problems, source="tools/call")
    for input_request in InputRequest.objects.filter(pk__in=list(answered_request_ids)):
        _mark_delivered(input_request=input_request)
    if task.is_terminal:
        _finished(task)
    if sent_by_gateway:
        # Whether the task has asked anything (the inbox's sockets hear of it then) is known without a lookup: the
        # gateway sends only a first round, never gated, so only this answer can have asked.
        asks = isinstance(outcome, ToolInputRequired) or (
            isinstance(outcome, TaskCreated) and bool(outcome.task.input_requests)
        )
        _publish_after_commit(task.id, server_id=task.server_id, asks=asks)
    else:
        _publish_after_commit(task.id)
    return task
