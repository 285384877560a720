"""Every change to a Task or an InputRequest. Views, jobs and the tracker call these; nothing else writes the models.

Each service is one transaction that writes the state, its audit row(s) and the hand-off to a job
together (hooks.py), and announces the change after commit (signals.py; the live layer listens). Rows are
locked task first, then input requests.
"""

import datetime
import functools
import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, Max, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from taskhub.accounts import permissions
from taskhub.audit.models import AuditEvent, agent_label
from taskhub.audit.services import SYSTEM, WORKER, agent_facts, record_event, storable
from taskhub.mcp import schema_fields
from taskhub.mcp.client import CallOutcome, TaskCreated, ToolCompleted, ToolInputRequired
from taskhub.mcp.secret_urls import mask_urls_in
from taskhub.mcp.wire import TaskSnapshot
from taskhub.observability import tracing
from taskhub.servers import services as server_services
from taskhub.servers.catalogue import find_tool
from taskhub.servers.hooks import job_queue
from taskhub.servers.models import Server, ServerProcess
from taskhub.tasks import hooks, signals, storable_text
from taskhub.tasks.answers import validate_response
from taskhub.tasks.errors import (
    AlreadyAnswered,
    AnswerRejected,
    ArgumentsRejected,
    InputNoLongerOpen,
    InvalidTransition,
    LaunchRefused,
    LeaseLost,
    PolicyRefused,
    TaskAlreadyFinished,
    UnknownTool,
)
from taskhub.tasks.models import (
    CANCELLED_NOT_SENT,
    GATE_KEY,
    GATE_METHOD,
    LAUNCH_ATTEMPTS,
    LAUNCH_ERROR_MAX_CHARS,
    LIVE_STATUSES,
    NOT_APPROVED,
    STATUS_MESSAGE_MAX_CHARS,
    TASK_PHASE,
    TERMINAL_STATUSES,
    TRUNCATION_NOTE,
    InputRequest,
    InputRequestState,
    Task,
    TaskPoll,
    TaskStatus,
    has_input_requests,
)

# What apply_snapshot compares. lastUpdatedAt is left out on purpose: some peers bump it on every
# read, so it is stored only along with a real change.
SNAPSHOT_FIELDS = ("status", "status_message", "result", "error", "ttl_ms", "poll_interval_ms", "remote_created_at")
TERMINAL_FIELDS = ("status", "result", "error")
# What a protocol error note quotes of a stored or received value, at most (as JSON).
QUOTE_MAX_CHARS = 500
# What a log line quotes of a problem, at most: the timeline has the rest.
LOG_PROBLEM_MAX_CHARS = 300

logger = logging.getLogger(__name__)


def _log_after_commit(message: str, task: Task, *args: Any) -> None:
    """One WARNING line about `task` (our id, its server, the server's task id) once the change is committed: a
    task that ended badly or a server that broke the protocol, for whoever reads the logs rather than the pages."""
    where = (task.id, task.server_id, task.remote_task_id)
    transaction.on_commit(lambda: logger.warning(f"task %s (server %s, remote task %r) {message}", *where, *args))


def cap_status_message(text: str | None) -> str:
    text = text or ""
    if len(text) <= STATUS_MESSAGE_MAX_CHARS:
        return text
    return text[: STATUS_MESSAGE_MAX_CHARS - len(TRUNCATION_NOTE)] + TRUNCATION_NOTE


def _publish_after_commit(task_id: uuid.UUID, *, server_id: int | None = None, asks: bool = False) -> None:
    """`server_id` and `asks`: the task's server and whether the task has input requests (the inbox's sockets hear of
    it then), from a caller that knows both, so the publish need not look the task up."""
    signals.announce_task_changed(task_id, server_id=server_id, asks=asks)


def _finished(task: Task) -> None:
    """Every service that makes a task terminal calls this: task_finished goes out once the change commits."""
    signals.announce_task_finished(task.id, task.status)


def _locked(task: Task) -> Task:
    return Task.objects.select_for_update().get(pk=task.pk)


def _locked_with_asks(task: Task) -> Task:
    """Locked, with `asks`: whether the task has input requests, whatever their state."""
    return Task.objects.select_for_update().annotate(asks=has_input_requests()).get(pk=task.pk)


# --- launching --------------------------------------------------------------------------------------


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
    server = Server.objects.get(pk=server.pk)  # the caller's copy may be stale
    if server.removed_at is not None:
        raise InvalidTransition(f"The server {server.name!r} was removed; its tools cannot be launched any more.")
    if not server.enabled:
        raise InvalidTransition(f"The server {server.name!r} is disabled; enable it before launching tools on it.")
    check_launch(server=server, tool=tool, arguments=arguments)
    task = Task.objects.create(
        server=server,
        tool=tool,
        arguments=arguments,
        launched_by=user,
        launched_via_token=token,
        launched_via_label=agent_label(agent_facts(token)) if token is not None else "",
    )
    record_event(
        action="task.launched",
        user=user,
        task=task,
        server=server,
        data={"tool": tool, "arguments": arguments, "server": server.name},
        token=token,
    )
    terms = permissions.answer_terms(server_id=server.pk, tool=tool)
    if terms.gate_before_call:
        _gate(task, terms=terms)
    else:
        hooks.enqueue_launch(task.id, queue=job_queue(server), declares_tasks=declares_tasks)
    _publish_after_commit(task.id)
    return task


def _gate(task: Task, *, terms) -> None:
    """Hold the launch for an approval (the gate before the call): nothing is sent until it is accepted."""
    task.status_message = f"waiting for approval before the call ({terms.policy})"
    task.save(update_fields=["status_message", "updated_at"])
    gate = InputRequest.objects.create(
        task=task,
        mrtr_round=TASK_PHASE,
        key=GATE_KEY,
        method=GATE_METHOD,
        params={"message": f"Run {task.tool[:200]} on {task.server.name}?"},
    )
    _start_deadline(gate, terms=terms)
    record_event(
        action="task.launch_gated",
        actor_label=WORKER,
        task=task,
        data={"key": GATE_KEY, "policy": terms.policy_id, "answerers": terms.answerers},
    )
    signals.announce_input_requests_opened(task.id, [gate.pk])


def _pass_gate(
    task: Task, input_request: InputRequest, *, user, comment: str, why: str = "", data=None, token=None
) -> None:
    """The gate's answer, which nothing delivers: accepted, the launch goes out; declined or cancelled, the task ends
    not approved, and tools/call is never sent."""
    input_request.state = InputRequestState.DELIVERED
    input_request.delivered_at = input_request.answered_at
    input_request.save(update_fields=["state", "delivered_at"])
    if input_request.answer["action"] == "accept":
        task.status_message = ""
        task.save(update_fields=["status_message", "updated_at"])
        record_event(action="task.launch_approved", user=user, task=task, data={"key": input_request.key}, token=token)
        hooks.enqueue_launch(task.id, queue=job_queue(task.server))
        return
    words = "declined" if input_request.answer["action"] == "decline" else "cancelled"
    message = f"not approved: {why or f'{words} by {_name(user)}'}" + (f" ({comment})" if comment else "")
    task.status = TaskStatus.FAILED
    task.error = {"message": message, "kind": NOT_APPROVED}
    task.status_message = cap_status_message(message)
    task.finished_at = timezone.now()
    task.save(update_fields=["status", "error", "status_message", "finished_at", "updated_at"])
    record_event(
        action="task.not_approved",
        user=user,
        task=task,
        data={"action": input_request.answer["action"], **({"comment": comment} if comment else {}), **(data or {})},
        token=token,
    )
    _finished(task)


@transaction.atomic
def record_launch_outcome(*, task: Task, outcome: CallOutcome, answered_request_ids: Iterable[int] = ()) -> Task:
    """What tools/call answered: a result, MRTR input requests, or a durable task to follow.

    `answered_request_ids`: the answers an MRTR retry carried; the server's answer to it is their delivery."""
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
    else:
        raise TypeError(f"not a tools/call outcome: {outcome!r}")
    _reset_launch_attempts(task)
    task.save()
    record_event(action="task.launch_answered", actor_label=WORKER, task=task, data=data)

    _supersede_open_requests(task, reason="the tool call moved on")
    if isinstance(outcome, ToolInputRequired):
        rounds_so_far = task.input_requests.aggregate(last=Max("mrtr_round"))["last"] or 0
        _open_requests(task, outcome.input_requests, mrtr_round=rounds_so_far + 1, problems=problems)
    elif isinstance(outcome, TaskCreated):
        _open_requests(task, outcome.task.input_requests or {}, mrtr_round=TASK_PHASE, problems=problems)
        if task.status in LIVE_STATUSES:
            TaskPoll.objects.create(task=task, next_poll_at=now)
    _record_problems(task, problems, source="tools/call")
    for input_request in InputRequest.objects.filter(pk__in=list(answered_request_ids)):
        _mark_delivered(input_request=input_request)
    if task.is_terminal:
        _finished(task)
    _publish_after_commit(task.id)
    return task


@transaction.atomic
def mark_launch_unknown(*, task: Task, reason: str) -> bool:
    """tools/call may or may not have reached the server; shown as such and never resent by itself."""
    task = _locked(task)
    if task.status == TaskStatus.LAUNCH_UNKNOWN:
        return False
    if task.status != TaskStatus.LAUNCHING:
        raise InvalidTransition(f"Task {task.id} is {task.get_status_display()}; only a launching task can be unknown.")
    task.status = TaskStatus.LAUNCH_UNKNOWN
    task.status_message = cap_status_message(storable(reason))
    task.save(update_fields=["status", "status_message", "updated_at"])
    record_event(action="task.launch_unknown", actor_label=WORKER, task=task, data={"reason": task.status_message})
    _publish_after_commit(task.id)
    return True


# --- following --------------------------------------------------------------------------------------


@transaction.atomic
def apply_snapshot(*, task: Task, snapshot: TaskSnapshot, source: str = "poll", asked_at=None) -> bool:
    """Store what the server says about the task; return whether anything changed. Idempotent.

    `asked_at`: when the request that brought the snapshot was sent. Only an answer asked for after a key's
    delivery can say that the server asks for that key again (an earlier one may predate the delivery)."""
    task = _locked_with_asks(task)
    if task.remote_task_id is None:
        raise InvalidTransition(f"Task {task.id} has no remote task yet; nothing to apply a snapshot to.")
    if snapshot.task_id != task.remote_task_id:
        raise InvalidTransition(f"Snapshot of remote task {snapshot.task_id!r} given for task {task.id}.")
    if _older_than_stored(snapshot, task):
        # A poll sent before a notification (or another poll) whose newer state was stored first: applying it would
        # turn the task back and supersede requests the server still asks for, which are then never reopened.
        logger.debug("ignored a snapshot of task %s older than the stored one (%s)", task.id, source)
        return False
    problems: list[str] = []
    wanted = snapshot_values(snapshot, task, problems=problems)

    if task.is_terminal:
        contradictions = {
            field: {"stored": _quote(getattr(task, field)), "received": _quote(wanted[field])}
            for field in TERMINAL_FIELDS
            if getattr(task, field) != wanted[field]
        }
        if contradictions:
            record_protocol_error_once(
                task=task,
                data={
                    "problem": f"the task is {task.status}, which is final, but the server now says otherwise",
                    "source": source,
                    "contradictions": contradictions,
                },
            )
        return False

    changed = [field for field in SNAPSHOT_FIELDS if getattr(task, field) != wanted[field]]
    previous_status = task.status
    outstanding = (snapshot.input_requests or {}) if snapshot.status == TaskStatus.INPUT_REQUIRED else {}
    outstanding = storable(outstanding)
    # Whether the task has input requests once this is applied (it may open some): the pages to tell, known here.
    audience = {"server_id": task.server_id, "asks": task.asks or bool(outstanding)}
    if changed:
        for field in changed:
            setattr(task, field, wanted[field])
        task.remote_last_updated_at = snapshot.last_updated_at or task.remote_last_updated_at
        if task.is_terminal:
            task.finished_at = timezone.now()
        task.save(update_fields=[*changed, "remote_last_updated_at", "finished_at", "updated_at"])
        data = {"source": source, "fields": changed, "status_message": task.status_message}
        if "status" in changed:
            record_event(
                action="task.status_changed",
                actor_label=WORKER,
                task=task,
                data={"from": previous_status, "to": task.status, **data},
            )
        else:
            record_event(action="task.updated", actor_label=WORKER, task=task, data=data)
        # Announced before task_finished: its receivers (the mail outbox) run first otherwise, and the pages wait.
        _publish_after_commit(task.id, **audience)
        if task.is_terminal:
            TaskPoll.objects.filter(task=task).delete()
            _finished(task)

    superseded = confirmed = 0
    if task.asks:  # a task that never asked has nothing to supersede or confirm: two queries fewer per change
        superseded = _supersede_open_requests(task, keep=set(outstanding), reason=f"no longer asked for ({source})")
        confirmed = _confirm_interrupted_deliveries(task, keep=set(outstanding), asked_at=asked_at)
    opened = _open_requests(task, outstanding, mrtr_round=TASK_PHASE, problems=problems, asked_at=asked_at)
    _record_problems(task, problems, source=source)
    anything = bool(changed or superseded or confirmed or opened)
    if anything and not changed:
        _publish_after_commit(task.id, **audience)
    return anything


def snapshot_values(snapshot: TaskSnapshot, task: Task, *, problems: list[str] | None = None) -> dict[str, Any]:
    """The columns a snapshot sets. A result on a task that is not completed (or an error on one that is not
    failed) is not stored: it would show as the outcome of a task that has none yet; it goes to `problems`."""
    result, error = snapshot.tool_result, snapshot.error
    if result is not None and snapshot.status != TaskStatus.COMPLETED:
        result = None
        if problems is not None:
            problems.append(f"a {snapshot.status} task carries a result (not stored)")
    if error is not None and snapshot.status != TaskStatus.FAILED:
        error = None
        if problems is not None:
            problems.append(f"a {snapshot.status} task carries an error (not stored)")
    return {
        "status": snapshot.status,
        "status_message": cap_status_message(storable(snapshot.status_message)),
        "result": storable(result),
        "error": storable(error),
        "ttl_ms": snapshot.ttl_ms,
        "poll_interval_ms": snapshot.poll_interval_ms,
        "remote_created_at": storable(snapshot.created_at) or task.remote_created_at,
    }


def _remote_time(text: str | None) -> datetime.datetime | None:
    try:
        moment = datetime.datetime.fromisoformat(text or "")
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _older_than_stored(snapshot: TaskSnapshot, task: Task) -> bool:
    """Whether the server's `lastUpdatedAt` says this snapshot predates the state stored from it. A peer's missing
    or unreadable time (or one without a zone) never makes a snapshot stale."""
    received, stored = _remote_time(snapshot.last_updated_at), _remote_time(task.remote_last_updated_at)
    return received is not None and stored is not None and received < stored


def _quote(value: Any) -> Any:
    """`value` itself when short, else its beginning as text: a note on the timeline stays small."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= QUOTE_MAX_CHARS:
        return value
    return f"{text[: QUOTE_MAX_CHARS - 1]}… ({len(text)} characters of JSON)"


def _record_problems(task: Task, problems: list[str], *, source: str) -> None:
    if problems:
        text = "; ".join(dict.fromkeys(problems))
        if len(text) > 4 * QUOTE_MAX_CHARS:
            text = text[: 4 * QUOTE_MAX_CHARS - 1] + "…"
        record_protocol_error_once(task=task, data={"problem": text, "source": source})


def record_protocol_error_once(*, task: Task, data: dict[str, Any]) -> bool:
    """Put a server's bad answer on the task's timeline unless it repeats the last one there: a peer that repeats
    the same problem is recorded once, so a repeated snapshot still writes nothing. True: recorded."""
    last = AuditEvent.objects.filter(task=task, action="task.protocol_error").order_by("-time", "-id").first()
    if last is not None and last.data == storable(data):  # compared as stored (NULs replaced, …)
        return False
    record_event(action="task.protocol_error", actor_label=WORKER, task=task, data=data)
    problem = str(data.get("problem", ""))[:LOG_PROBLEM_MAX_CHARS]
    _log_after_commit("protocol error: %r", task, problem)  # %r: a server's words on one escaped line
    return True


def _open_requests(
    task: Task, requests: dict[str, dict[str, Any]], *, mrtr_round: int, problems: list[str], asked_at=None
) -> list[InputRequest]:
    """Open the keys not seen before. A key already answered (or dropped) that the server asks for again is
    never reopened; that, and params taskhub cannot show, go to `problems` (the request still opens, so an
    approver can decline or cancel it and the task can move on)."""
    if not requests:
        return []
    rows = InputRequest.objects.filter(task=task, mrtr_round=mrtr_round).values_list("key", "state", "delivered_at")
    known = {key: (state, delivered_at) for key, state, delivered_at in rows}
    opened = []
    room = None  # how many more requests the server may open; counted once, only when a key is new
    refused_over_cap = 0
    for key, request in storable(requests).items():
        if key in known:
            state, delivered_at = known[key]
            asked_after_delivery = asked_at is not None and delivered_at is not None and delivered_at < asked_at
            if state == InputRequestState.SUPERSEDED or (state == InputRequestState.DELIVERED and asked_after_delivery):
                was = "answered" if state == InputRequestState.DELIVERED else "no longer asked for"
                problems.append(f"the server asks again for the key {_quote(key)!r}, which was {was}; not reopened")
            continue
        if room is None:
            room = _open_request_room(task)
        if room <= 0:
            refused_over_cap += 1
            continue
        room -= 1
        request = request if isinstance(request, dict) else {}
        params = request.get("params")
        method = str(request.get("method") or "")
        if params is not None and not isinstance(params, dict):
            problems.append(f"the params of input request {_quote(key)!r} are not an object")
        params = params if isinstance(params, dict) else {}
        if method == "elicitation/create" and (params.get("mode") or "form") == "form":
            form = schema_fields.build_fields(params.get("requestedSchema"), schema_fields.ELICITATION)
            if not form.renderable:
                problems.append(f"the schema of input request {_quote(key)!r} is invalid: {form.problem}")
        input_request = InputRequest.objects.create(
            task=task,
            mrtr_round=mrtr_round,
            key=key,
            method=method,
            params=params,
        )
        record_event(
            action="task.input_requested",
            actor_label=WORKER,
            task=task,
            data={"key": key, "method": input_request.method, "mrtr_round": mrtr_round},
        )
        opened.append(input_request)
    if opened:
        terms = permissions.answer_terms(server_id=task.server_id, tool=task.tool)
        for input_request in opened:
            _start_deadline(input_request, terms=terms)
    if refused_over_cap:
        _refuse_over_cap(task, refused=refused_over_cap)
    signals.announce_input_requests_opened(task.id, [input_request.pk for input_request in opened])
    return opened


OVER_CAP_MARK = "open_request_cap"


def _open_request_room(task: Task) -> int:
    """How many more open requests the task's server may have (TASKHUB_MAX_OPEN_REQUESTS_PER_SERVER).

    Counted, not locked: two tasks of one server opening requests at once may pass the cap by a few; what it guards
    against is thousands."""
    cap = settings.TASKHUB_MAX_OPEN_REQUESTS_PER_SERVER
    return cap - InputRequest.objects.filter(server_id=task.server_id, state=InputRequestState.OPEN).count()


def _refuse_over_cap(task: Task, *, refused: int) -> None:
    """Requests past the server's cap are not opened (a later poll opens them once there is room again). The task's
    timeline says so once, and the server is flagged on the servers page (its last error)."""
    cap = settings.TASKHUB_MAX_OPEN_REQUESTS_PER_SERVER
    said_before = AuditEvent.objects.filter(
        task=task, action="task.protocol_error", data__has_key=OVER_CAP_MARK
    ).exists()
    if said_before:
        return
    problem = (
        f"the server is over its open-request cap ({cap} open requests per server): "
        f"{refused} new request(s) of this task are not shown until some are answered"
    )
    record_event(
        action="task.protocol_error",
        actor_label=WORKER,
        task=task,
        data={"problem": problem, OVER_CAP_MARK: cap, "not_opened": refused},
    )
    _log_after_commit("protocol error: %s", task, problem)
    now = timezone.now()
    Server.objects.filter(pk=task.server_id).update(
        last_error=f"over its open-request cap: more than {cap} requests waiting for an answer; new ones are not "
        "shown until some are answered",
        last_error_at=now,
        updated_at=now,
    )


def _supersede_open_requests(task: Task, *, reason: str, keep: set[str] | frozenset[str] = frozenset()) -> int:
    """Open requests the server no longer lists become superseded; answered ones stay as they are."""
    vanished = (
        InputRequest.objects.select_for_update()
        .filter(task=task, state=InputRequestState.OPEN)
        .exclude(mrtr_round=TASK_PHASE, key__in=keep)
    )
    count = 0
    for input_request in vanished:
        input_request.state = InputRequestState.SUPERSEDED
        input_request.save(update_fields=["state"])
        record_event(
            action="input.superseded",
            actor_label=WORKER,
            task=task,
            data={"key": input_request.key, "mrtr_round": input_request.mrtr_round, "reason": reason},
        )
        count += 1
    return count


def _confirm_interrupted_deliveries(task: Task, *, keep: set[str], asked_at) -> int:
    """Answers whose delivery was attempted before this snapshot was asked for, and whose key the server no
    longer lists, were received: servers drop answered keys and never reuse them. This is the test the delivery
    job's own retry makes (after a wait) when an attempt was cut off, e.g. its worker died between sending and
    recording; the tracker sees it on its next poll, so the answer does not show as undelivered meanwhile."""
    if asked_at is None:
        return 0
    received = (
        InputRequest.objects.filter(
            task=task,
            mrtr_round=TASK_PHASE,
            state=InputRequestState.ANSWERED,
            delivery_attempted_at__lt=asked_at,
        )
        .exclude(key__in=keep)
        .only("pk", "task_id")
    )
    confirmed_by = "tasks/get: the server no longer asks for the key"
    return sum(_mark_delivered(input_request=request, confirmed_by=confirmed_by) for request in received)


# --- answers ----------------------------------------------------------------------------------------


def locked_for_answer(*, input_request_id: int) -> InputRequest:
    """The input request with its task and server, locked for answering until the caller's transaction ends
    (InputRequest.DoesNotExist if there is none). answer_input reads it so; a view that must read the request
    before it answers (to check who may, to read the form) reads it with this, in a transaction around both, and
    passes `locked=True`: answer_input does not read it again, one statement less before the answer is stored.

    Lock order task → input request, as apply_snapshot does; the second of two answers waits here. One statement:
    Postgres locks the rows of `FOR UPDATE OF` in the order it names them (the task's, then the request's). Only
    locked rows are read again when a lock was waited for, so who answered (or the escalation group) is not joined
    here: the rare paths that show them read them after the lock."""
    return (
        InputRequest.objects.select_for_update(of=("task", "self"))
        .select_related("task__server")
        .get(pk=input_request_id)
    )


@tracing.traced("taskhub.answer.submit", attributes=tracing.answer_attributes, result_attributes=tracing.answered)
def answer_input(
    *,
    input_request: InputRequest,
    response: dict[str, Any],
    user,
    comment: str = "",
    token=None,
    as_agent: bool = False,
    locked: bool = False,
) -> InputRequest:
    """Record one person's answer; the delivery job sends it. One answer per key, whoever clicks first. `token`: the API
    token (an agent) it came through, named in the audit rows.

    In a transaction of its own (a savepoint inside the caller's), where it reads the request locked; or with
    `locked`, in the caller's, where the caller read it with locked_for_answer: an error raised here then ends
    the caller's transaction too (it must not go on in it), which has changed nothing before.

    The request's approval policy (permissions.answer_terms) applies here, whichever page or API calls: who may
    answer, self-approval, a comment on decline, and N of M, where an acceptance before the N-th is recorded (the
    request stays open) and only the N-th makes the answer sent; a decline or a cancel by any of them ends it.
    `as_agent`: the gateway passes a request through to the agent that made the call (no policy applies, or its
    policy says `input_from` agent): `user` is that agent, whose one answer is the answer; the rules about people
    do not apply."""
    answering = dict(response=response, user=user, comment=comment, token=token, as_agent=as_agent)
    if locked:
        if not connection.in_atomic_block:  # the caller's transaction ended, and its lock with it
            raise transaction.TransactionManagementError("locked=True: read with locked_for_answer in this transaction")
        return _answer(input_request=input_request, **answering)
    with transaction.atomic():
        return _answer(input_request=locked_for_answer(input_request_id=input_request.pk), **answering)


def _answer(
    *, input_request: InputRequest, response: dict[str, Any], user, comment: str, token, as_agent: bool
) -> InputRequest:
    task = input_request.task
    if input_request.state in (InputRequestState.ANSWERED, InputRequestState.DELIVERED):
        raise AlreadyAnswered(
            key=input_request.key,
            answered_by=answerer_name(input_request),
            answered_at=input_request.answered_at,
        )
    if input_request.state == InputRequestState.SUPERSEDED:
        raise InputNoLongerOpen(f"The server no longer asks {input_request.key!r}; the answer was not recorded.")
    if task.is_terminal:
        raise InputNoLongerOpen(f"The task is {task.get_status_display()}; it takes no more answers.")
    if task.server.removed_at is not None:
        raise InputNoLongerOpen(f"The server {task.server.name!r} was removed; it takes no more answers.")
    _refuse_unstorable_answer(response)
    answer = validate_response(method=input_request.method, params=input_request.params, response=response)
    comment = _checked_comment(comment)
    terms = permissions.answer_terms(server_id=task.server_id, tool=task.tool)
    if not as_agent:
        refusal = permissions.answer_refusal(
            input_request=input_request, answer=answer, user=user, terms=terms, comment=comment
        )
        if refusal:
            raise PolicyRefused(refusal)
    now = timezone.now()
    answered = {
        "key": input_request.key,
        "mrtr_round": input_request.mrtr_round,
        "answer": answer,
        **({"policy": terms.policy_id} if terms.policy_id is not None else {}),
        **({"answered_as": "agent"} if as_agent else {}),
    }
    commented = {"comment": comment} if comment else {}
    required = 1
    if answer["action"] == "accept" and not as_agent:
        count = permissions.count_acceptance(
            input_request=input_request, terms=terms, acceptance=_acceptance(user, answer, now, comment)
        )
        required, input_request.acceptances = count.required, count.acceptances
        if count.discounted:
            _record_discounted(task, input_request, count.discounted, answered=answered, user=user, token=token)
        if not count.enough:
            input_request.save(update_fields=["acceptances", "discounted_acceptances"])
            record_event(
                action="input.accepted",
                user=user,
                task=task,
                data={**answered, "accepted": len(count.acceptances), "required": required, **commented},
                token=token,
            )
            _publish_after_commit(task.id, server_id=task.server_id, asks=True)
            input_request.task = task
            input_request.answer_terms = terms  # the card shows them without reading the policy again
            return input_request
    input_request.state = InputRequestState.ANSWERED
    input_request.answer = answer
    input_request.answered_by = user
    input_request.answered_at = now
    input_request.answer_comment = comment
    input_request.save(
        update_fields=[
            "state",
            "answer",
            "answered_by",
            "answered_at",
            "answer_comment",
            "acceptances",
            "discounted_acceptances",
        ]
    )
    accepted_by = [entry.get("name") for entry in input_request.acceptances]
    record_event(
        action="input.answered",
        user=user,
        task=task,
        data={
            **answered,
            **({"accepted_by": accepted_by, "required": required} if accepted_by else {}),
            **commented,
        },
        token=token,
    )
    if input_request.method == GATE_METHOD:
        _pass_gate(task, input_request, user=user, comment=comment, token=token)
    else:
        hooks.enqueue_answer_delivery(input_request.pk, server_id=task.server_id, queue=job_queue(task.server))
    _publish_after_commit(task.id, server_id=task.server_id, asks=True)
    input_request.task = task  # as locked, with its server: the caller shows the answered card without reading again
    input_request.answer_terms = terms
    return input_request


def _record_discounted(task: Task, input_request: InputRequest, discounted: list[dict], *, answered, user, token):
    """N of M: earlier acceptances the policy in force no longer allows stop counting; the card and the audit trail
    say whose and why."""
    input_request.discounted_acceptances = [*input_request.discounted_acceptances, *discounted]
    record_event(
        action="input.acceptances_discounted",
        user=user,
        task=task,
        data={
            "key": answered["key"],
            "mrtr_round": answered["mrtr_round"],
            **({"policy": answered["policy"]} if "policy" in answered else {}),
            "discounted": [{"name": entry.get("name"), "why": entry.get("why")} for entry in discounted],
        },
        token=token,
    )


COMMENT_MAX_CHARS = 2000


def _checked_comment(comment: str) -> str:
    comment = (comment or "").strip()
    if len(comment) > COMMENT_MAX_CHARS:
        raise AnswerRejected(f"The comment is too long: at most {COMMENT_MAX_CHARS} characters.")
    problem = storable_text.value_problem(comment)
    if problem:
        raise AnswerRejected(f"The comment {problem}.")
    return comment


def _acceptance(user, answer, now, comment: str) -> dict[str, Any]:
    entry = {"user": user.pk, "name": user.get_username(), "at": now.isoformat()}
    if "content" in answer:
        entry["content"] = answer["content"]
    if comment:
        entry["comment"] = comment
    return entry


def _refuse_unstorable_answer(response: Any) -> None:
    content = response.get("content") if isinstance(response, dict) else None
    unstorable = storable_text.unstorable_fields(content) if isinstance(content, dict) else {}
    if not unstorable:
        problem = storable_text.value_problem(response)
        unstorable = {"": f"The answer {problem}."} if problem else {}
    if unstorable:
        raise AnswerRejected("The answer contains text that cannot be stored.", unstorable)


def _name(user) -> str:
    return user.get_username() if user is not None else "a deleted user"


DEFAULT_ANSWERER = "taskhub, at the deadline"


def answerer_name(input_request: InputRequest) -> str:
    """Who gave a request's answer: a person, or taskhub when it applied the policy's default at the deadline."""
    if input_request.answered_by_id is None and input_request.default_applied_at is not None:
        return DEFAULT_ANSWERER
    return _name(input_request.answered_by)


def claim_delivery(*, input_request: InputRequest, attempted_by: str = "", only_if: Q | None = None) -> bool:
    """Commit, before sending, that this answer may reach the server (see InputRequest.delivery_attempted_at).

    A compare-and-set on the attempt time the caller read: of two jobs delivering one answer at once (a job
    recovered as stalled while its worker still runs it), only one may send. False: another attempt won, or
    `only_if` (a condition checked in the same statement: the worker's own heartbeat is fresh) did not hold. On
    success `input_request` carries the new attempt time, so the same caller can claim again (renew) before sending.
    """
    attempted_at = timezone.now()
    claims = InputRequest.objects.filter(
        pk=input_request.pk,
        state=InputRequestState.ANSWERED,
        delivery_attempted_at=input_request.delivery_attempted_at,
    )
    if only_if is not None:
        claims = claims.filter(only_if)
    claimed = claims.update(delivery_attempted_at=attempted_at, delivery_attempted_by=attempted_by) == 1
    if claimed:
        input_request.delivery_attempted_at = attempted_at
        input_request.delivery_attempted_by = attempted_by
    return claimed


def first_claim(
    *, input_request_id: int, attempted_by: str = "", only_if: tuple[str, Sequence[Any]] | None = None
) -> tuple[str, list[Any]]:
    """claim_delivery for the first attempt to send a task-phase answer, as one statement (and its parameters) that
    also reads what the sending needs: the request with its task and server, as claimed (no lookup before the claim:
    the delivery job's hot path, which runs it on the worker's own pool: jobs.py). Its row, read by first_claimed, is
    None when it is not that (delivered already, an MRTR round's answer, a task with no remote id yet, an attempt made
    before) or `only_if` (SQL of a condition and its parameters) did not hold: the caller then reads the request and
    decides, as claim_delivery's callers do."""
    sql = _first_claim_sql() + (f" AND ({only_if[0]})" if only_if else "") + " RETURNING " + _first_claim_columns()
    params = [timezone.now(), attempted_by, input_request_id, TASK_PHASE, *(only_if[1] if only_if else ())]
    return sql, params


def first_claimed(row: Sequence[Any] | None) -> InputRequest | None:
    """The request claimed by first_claim's statement, with its task and server, from the row it returned."""
    if row is None:
        return None
    input_request, task, server = _instances(row, (InputRequest, Task, Server))
    task._state.fields_cache["server"] = server
    input_request._state.fields_cache["task"] = task
    return input_request


@functools.cache
def _first_claim_sql() -> str:
    request, task, server = (model._meta.db_table for model in (InputRequest, Task, Server))
    return (
        f'UPDATE "{request}" AS request SET delivery_attempted_at = %s, delivery_attempted_by = %s '
        f'FROM "{task}" AS task JOIN "{server}" AS server ON server.id = task.server_id '
        f"WHERE request.id = %s AND task.id = request.task_id AND request.state = '{InputRequestState.ANSWERED}' "
        "AND request.delivery_attempted_at IS NULL AND request.mrtr_round = %s AND task.remote_task_id IS NOT NULL"
    )


@functools.cache
def _first_claim_columns() -> str:
    return ", ".join(
        f'{alias}."{field.column}"'
        for alias, model in (("request", InputRequest), ("task", Task), ("server", Server))
        for field in model._meta.concrete_fields
    )


def _instances(row: Sequence[Any], models: Sequence[type]) -> list:
    """Model instances from a row holding each model's concrete columns in turn, converted as the ORM converts them
    (JSON, encrypted fields)."""
    instances, start = [], 0
    for model in models:
        fields = model._meta.concrete_fields
        values = []
        for field, value in zip(fields, row[start : start + len(fields)], strict=True):
            for converter in field.get_db_converters(connection):
                value = converter(value, None, connection)
            values.append(value)
        instances.append(model.from_db(connection.alias, [field.attname for field in fields], values))
        start += len(fields)
    return instances


@transaction.atomic
def mark_delivered(*, input_request: InputRequest, confirmed_by: str | None = None) -> bool:
    """The server acknowledged the answer (the delivery job). Idempotent: a repeated delivery changes nothing.

    `confirmed_by`: no acknowledgement came, but this shows the answer was received (the key is no longer
    outstanding); it goes on the timeline. The tracker polls the task at once to see what the answer changed.
    """
    delivered = _mark_delivered(input_request=input_request, confirmed_by=confirmed_by)
    _poll_soon(task_id=input_request.task_id)
    return delivered


def _mark_delivered(*, input_request: InputRequest, confirmed_by: str | None = None) -> bool:
    task = Task.objects.select_for_update().get(pk=input_request.task_id)
    input_request = InputRequest.objects.select_for_update().get(pk=input_request.pk)
    if input_request.state == InputRequestState.DELIVERED:
        return False
    if input_request.state != InputRequestState.ANSWERED:
        raise InvalidTransition(
            f"The request {input_request.key!r} is {input_request.state}; only answers are delivered."
        )
    input_request.state = InputRequestState.DELIVERED
    input_request.delivered_at = timezone.now()
    input_request.save(update_fields=["state", "delivered_at"])
    record_event(
        action="input.delivered",
        actor_label=WORKER,
        task=task,
        data={
            "key": input_request.key,
            "mrtr_round": input_request.mrtr_round,
            **({"confirmed_by": confirmed_by} if confirmed_by else {}),
        },
    )
    _publish_after_commit(task.id, server_id=task.server_id, asks=True)
    return True


# --- answer deadlines --------------------------------------------------------------------------------

NO_ANSWER_IN_TIME = "no answer before the deadline"


def _start_deadline(input_request: InputRequest, *, terms) -> None:
    """Fix the request's answer deadline as its approval rules say, and defer the jobs that act on it."""
    deadline = permissions.answer_deadline(terms=terms, opened_at=input_request.created_at)
    if deadline is None:
        return
    input_request.answer_deadline_at = deadline.at
    input_request.save(update_fields=["answer_deadline_at"])
    hooks.enqueue_deadline_checks(input_request.pk, at=[deadline.near_at, deadline.at])


@dataclass(frozen=True, kw_only=True)
class DeadlineOutcome:
    """What taskhub does with a request nobody answered by its deadline, as its approval policy decided it
    (taskhub.approvals.deadlines); apply_deadline_default does it."""

    policy_id: int | None
    at_deadline: str  # what the policy says (decline | cancel | answer | escalate), for the audit trail
    action: str  # what is done: escalate | not_approved (a gate) | answer | cancel
    response: dict[str, Any] | None = None  # the answer recorded, for "answer": an acceptance or a decline
    group: Any = None  # the escalation group (a Group), for "escalate"
    required_accepts: int = 1  # N of M: how many acceptances the request needed
    problems: tuple[str, ...] = ()  # why the policy's default was replaced by another


ACTION_OUTCOMES = {"accept": "answered", "decline": "declined", "cancel": "cancelled"}


@transaction.atomic
def apply_deadline_default(*, input_request_id: int, outcome: DeadlineOutcome, now) -> str | None:
    """Do what the policy decided for a request nobody answered by its deadline, with taskhub as the actor; once only.

    Returns what was done ("declined", "cancelled", "answered", "escalated", "not approved", "nothing"), or None when
    nothing was due: answered meanwhile (a person who answers at the same instant waits on the lock, then wins or
    finds it answered), already applied, not yet due, ended, or its server removed."""
    task_id = InputRequest.objects.filter(pk=input_request_id).values_list("task_id", flat=True).first()
    if task_id is None:
        return None
    task = Task.objects.select_for_update(of=("self",)).select_related("server").get(pk=task_id)
    input_request = InputRequest.objects.select_for_update(of=("self",)).get(pk=input_request_id)
    if (
        input_request.state != InputRequestState.OPEN
        or input_request.default_applied_at is not None
        or input_request.answer_deadline_at is None
        or input_request.answer_deadline_at > now
        or task.is_terminal
        or task.server.removed_at is not None  # it takes no answers any more (answer_input says so too)
    ):
        return None
    input_request.default_applied_at = now
    data: dict[str, Any] = {
        "key": input_request.key,
        "mrtr_round": input_request.mrtr_round,
        "policy": outcome.policy_id,
        "at_deadline": outcome.at_deadline,
        "deadline": input_request.answer_deadline_at.isoformat(),
    }
    if input_request.acceptances:
        data["partial"] = (
            f"{len(input_request.acceptances)} of {outcome.required_accepts} acceptances before the deadline: not "
            "enough, the default applies"
        )
    problems = list(outcome.problems)
    if outcome.action == "escalate":
        input_request.escalated_to = outcome.group
        input_request.save(update_fields=["default_applied_at", "escalated_to"])
        return _default_applied(task, "escalated", {**data, "escalated_to": outcome.group.name}, problems)
    if outcome.action == "not_approved":
        _answer_by_default(input_request, {"action": "decline"}, now)
        _pass_gate(
            task, input_request, user=None, comment="", why=NO_ANSWER_IN_TIME, data={"policy": outcome.policy_id}
        )
        return _default_applied(task, "not approved", data, problems)
    if outcome.action == "cancel":
        return _cancel_by_default(task, input_request, data, problems)
    response = outcome.response or {"action": "decline"}
    _answer_by_default(input_request, response, now)
    hooks.enqueue_answer_delivery(input_request.pk, server_id=task.server_id, queue=job_queue(task.server))
    return _default_applied(task, ACTION_OUTCOMES[response["action"]], {**data, "answer": response}, problems)


def _cancel_by_default(task: Task, input_request: InputRequest, data: dict[str, Any], problems: list[str]) -> str:
    input_request.save(update_fields=["default_applied_at"])
    try:
        request_cancel(task=task, user=None)
    except InvalidTransition as refused:  # e.g. its launch outcome is unknown: there is nothing to cancel
        problems.append(f"the task could not be cancelled: {refused}")
        return _default_applied(task, "nothing", data, problems)
    return _default_applied(task, "cancelled", data, problems)


def _answer_by_default(input_request: InputRequest, response: dict[str, Any], now) -> None:
    input_request.state = InputRequestState.ANSWERED
    input_request.answer = response
    input_request.answered_by = None
    input_request.answered_at = now
    input_request.answer_comment = NO_ANSWER_IN_TIME
    input_request.save(
        update_fields=["state", "answer", "answered_by", "answered_at", "answer_comment", "default_applied_at"]
    )


def _default_applied(task: Task, outcome: str, data: dict[str, Any], problems: list[str]) -> str:
    record_event(
        action="input.default_applied",
        actor_label=SYSTEM,
        task=task,
        data={**data, "outcome": outcome, **({"problem": "; ".join(problems)} if problems else {})},
    )
    _publish_after_commit(task.id)
    return outcome


@transaction.atomic
def mark_deadline_near(*, input_request_id: int, near_at, now) -> bool:
    """Whether the "deadline near" notice of this request is due now (`near_at`, as its approval rules say) and not
    sent before (then it is marked sent)."""
    if now < near_at:
        return False
    input_request = (
        InputRequest.objects.select_for_update()
        .filter(
            pk=input_request_id,
            state=InputRequestState.OPEN,
            deadline_near_sent_at__isnull=True,
            default_applied_at__isnull=True,
            answer_deadline_at__gt=now,
        )
        .first()
    )
    if input_request is None:
        return False
    input_request.deadline_near_sent_at = now
    input_request.save(update_fields=["deadline_near_sent_at"])
    return True


# --- cancel and expiry ------------------------------------------------------------------------------


@transaction.atomic
def request_cancel(*, task: Task, user, bulk_action: int | None = None, lane: str | None = None, token=None) -> Task:
    """Record the wish to cancel; the cancel job sends tasks/cancel. Asking twice is asking once.

    `bulk_action`: the audit row of the bulk cancel this one is part of (bulk.py), named in this task's row;
    `lane`: the bulk's job lane for the task's server (hooks.enqueue_cancel_delivery); `token`: the API token (an
    agent) the cancel came through, named in its audit rows."""
    task = _locked(task)
    if task.is_terminal:
        raise TaskAlreadyFinished(f"The task is already {task.get_status_display()}; there is nothing to cancel.")
    if task.status == TaskStatus.LAUNCH_UNKNOWN:
        raise InvalidTransition(
            "The launch outcome is unknown, so there is no remote task to cancel; check the server directly."
        )
    if task.cancel_requested_at is not None:
        return task
    if task.status == TaskStatus.LAUNCHING and task.input_requests.filter(method=GATE_METHOD, state="open").exists():
        return _cancel_at_the_gate(task, user=user, bulk_action=bulk_action, token=token)
    task.cancel_requested_at = timezone.now()
    task.cancel_requested_by = user
    task.save(update_fields=["cancel_requested_at", "cancel_requested_by", "updated_at"])
    data = {"status": task.status, **({"bulk_action": bulk_action} if bulk_action is not None else {})}
    record_event(action="task.cancel_requested", user=user, task=task, data=data, token=token)
    if task.status == TaskStatus.LAUNCHING and not launch_was_sent(task=task):
        _cancel_before_sending(task)
    else:
        hooks.enqueue_cancel_delivery(task.id, queue=job_queue(task.server), lane=lane)
    _publish_after_commit(task.id)
    return task


def _cancel_before_sending(task: Task) -> None:
    """A launch whose tool call (of its current round) is not sent yet ends here, cancelled, and is never sent.

    The task is locked, and the launch job writes its `task.launch_sent` marker under that lock before it sends
    (mark_launch_sent): so either the marker is there and the call may be under way (then the cancel waits for its
    outcome, which may be unknown), or the job will find the task cancelled and send nothing. Its waiting retry is
    dropped."""
    task.status = TaskStatus.CANCELLED
    task.finished_at = timezone.now()
    task.mrtr_request_state = None
    task.launch_next_try_at = None
    task.save(update_fields=["status", "finished_at", "mrtr_request_state", "launch_next_try_at", "updated_at"])
    record_event(
        action="task.status_changed",
        actor_label=WORKER,
        task=task,
        data={
            "from": TaskStatus.LAUNCHING,
            "to": TaskStatus.CANCELLED,
            "source": CANCELLED_NOT_SENT,
            "sent": False,
            "attempts": task.launch_attempts,
        },
    )
    _supersede_open_requests(task, reason="the tool call was cancelled")
    hooks.drop_pending_launch(task.id)
    _finished(task)


def _cancel_at_the_gate(task: Task, *, user, bulk_action: int | None = None, token=None) -> Task:
    """A launch still waiting for its approval was never sent: it ends here, cancelled, with nothing to tell."""
    now = timezone.now()
    task.cancel_requested_at = task.cancel_delivered_at = task.finished_at = now
    task.cancel_requested_by = user
    task.status = TaskStatus.CANCELLED
    task.status_message = "cancelled before the call was approved"
    task.save()
    data = {"status": TaskStatus.LAUNCHING, **({"bulk_action": bulk_action} if bulk_action is not None else {})}
    record_event(action="task.cancel_requested", user=user, task=task, data=data, token=token)
    record_event(
        action="task.status_changed",
        user=user,
        task=task,
        data={"from": TaskStatus.LAUNCHING, "to": TaskStatus.CANCELLED, "source": "cancel before the approval"},
        token=token,
    )
    _supersede_open_requests(task, reason="the launch was cancelled before its approval")
    _finished(task)
    _publish_after_commit(task.id)
    return task


@transaction.atomic
def mark_cancel_delivered(*, task: Task) -> bool:
    """The server acknowledged tasks/cancel (which only asks: the task may still end otherwise); the tracker
    polls the task at once to see whether it did."""
    task = _locked(task)
    if task.cancel_requested_at is None:
        raise InvalidTransition(f"No cancel was requested for task {task.id}.")
    _poll_soon(task_id=task.id)
    if task.cancel_delivered_at is not None:
        return False
    task.cancel_delivered_at = timezone.now()
    task.save(update_fields=["cancel_delivered_at", "updated_at"])
    record_event(action="task.cancel_delivered", actor_label=WORKER, task=task, data={})
    _publish_after_commit(task.id)
    return True


@transaction.atomic
def expire(*, task: Task) -> bool:
    """Give up on a task past createdAt + ttlMs: the server may have deleted it. Returns False if already final."""
    task = _locked(task)
    if task.is_terminal:
        return False
    previous_status = task.status
    task.status = TaskStatus.EXPIRED
    task.finished_at = timezone.now()
    task.save(update_fields=["status", "finished_at", "updated_at"])
    TaskPoll.objects.filter(task=task).delete()
    record_event(
        action="task.expired",
        actor_label=WORKER,
        task=task,
        data={"from": previous_status, "ttl_ms": task.ttl_ms, "remote_created_at": task.remote_created_at},
    )
    _log_after_commit("expired (was %s, ttl %s ms)", task, previous_status, task.ttl_ms)
    _supersede_open_requests(task, reason="the task expired")
    _finished(task)
    _publish_after_commit(task.id)
    return True


LOST_MESSAGE = "the server process that held this task exited"


def sent_before(*, task: Task, moment) -> bool:
    """Whether the tools/call that created the task's remote task was sent before `moment` (read-only).

    A stdio server keeps its tasks in its process: a task sent before the current process started lived in
    an earlier one. A task with no marker at all (launched before markers existed) counts as sent before."""
    sent_at = (
        AuditEvent.objects.filter(task=task, action="task.launch_sent")
        .order_by("-time")
        .values_list("time", flat=True)
        .first()
    )
    return sent_at is None or sent_at < moment


@transaction.atomic
def mark_lost(*, task: Task, process_started_at, exit_detail: str = "") -> bool:
    """End a live task whose stdio server process exited: the process now running was started after the task
    was sent to the server and does not know it (it said so). Never before that: a task the current process
    created and forgot is the server's fault, handled like any other not-found answer. Returns whether it ended.
    """
    task = _locked(task)
    if task.is_terminal or task.remote_task_id is None or not sent_before(task=task, moment=process_started_at):
        return False
    previous_status = task.status
    task.status = TaskStatus.LOST
    task.status_message = LOST_MESSAGE
    task.finished_at = timezone.now()
    task.save(update_fields=["status", "status_message", "finished_at", "updated_at"])
    TaskPoll.objects.filter(task=task).delete()
    data = {"from": previous_status, "message": LOST_MESSAGE, "process_started_at": process_started_at.isoformat()}
    if exit_detail:
        data["exit"] = exit_detail[:500]
    record_event(action="task.lost", actor_label=WORKER, task=task, data=data)
    _supersede_open_requests(task, reason=LOST_MESSAGE)
    _finished(task)
    _publish_after_commit(task.id)
    return True


# --- sending tools/call (the launch job) -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LaunchCall:
    """What to send as tools/call: the first call (round 0), or the retry after MRTR round n with its answers."""

    tool: str
    arguments: dict[str, Any]
    mrtr_round: int
    input_responses: dict[str, Any] | None
    request_state: str | None
    answered_request_ids: tuple[int, ...]


def _launch_round(task: Task) -> int:
    """0 for the first tools/call; n for the retry that carries the answers of MRTR round n."""
    return task.input_requests.aggregate(last=Max("mrtr_round"))["last"] or 0


def _launch_round_sent(task: Task, mrtr_round: int) -> bool:
    return AuditEvent.objects.filter(task=task, action="task.launch_sent", data__mrtr_round=mrtr_round).exists()


def launch_was_sent(*, task: Task) -> bool:
    """Whether tools/call of the task's current round was already sent (read-only; see mark_launch_sent)."""
    return _launch_round_sent(task, _launch_round(task))


@transaction.atomic
def mark_launch_sent(*, task: Task, lease_owner: str | None = None) -> LaunchCall | None:
    """Record that tools/call is about to be sent, and return what to send; None when it must not be sent.

    The `task.launch_sent` audit row of the round is the marker: audit rows can never be changed or
    deleted, so once it is committed no job will send that round again. A job that finds the marker
    (it crashed after this point, or is a duplicate) makes the launch outcome unknown instead.

    `lease_owner`: the worker that runs a stdio server's process and sends through it. The statement that locks
    the task also checks, in Postgres, that this worker still holds the process's lease (owner and expiry): a
    worker paused past its lease, whose process another worker is about to replace, gets LeaseLost and sends
    nothing (its memory still says it owns the process; only the database knows it no longer does).
    """
    if lease_owner is None:
        task = _locked(task)
    else:
        holds = ServerProcess.objects.filter(
            server_id=OuterRef("server_id"), lease_owner=lease_owner, lease_expires_at__gt=Now()
        )
        task = Task.objects.select_for_update(of=("self",)).annotate(holds_lease=Exists(holds)).get(pk=task.pk)
        if not task.holds_lease:
            raise LeaseLost(f"worker {lease_owner} no longer holds the lease of server {task.server_id}'s process")
    if task.status != TaskStatus.LAUNCHING:
        return None
    mrtr_round = _launch_round(task)
    if _launch_round_sent(task, mrtr_round):
        mark_launch_unknown(
            task=task, reason="tools/call was sent, but its answer was never recorded (the worker stopped)."
        )
        return None
    answered = list(task.input_requests.filter(mrtr_round=mrtr_round)) if mrtr_round else []
    record_event(action="task.launch_sent", actor_label=WORKER, task=task, data={"mrtr_round": mrtr_round})
    return LaunchCall(
        tool=task.tool,
        arguments=task.arguments,
        mrtr_round=mrtr_round,
        input_responses={request.key: request.answer for request in answered} if mrtr_round else None,
        request_state=task.mrtr_request_state if mrtr_round else None,
        answered_request_ids=tuple(request.pk for request in answered),
    )


@transaction.atomic
def record_launch_failure(*, task: Task, error: dict[str, Any], sent: bool, unreachable: str | None = None) -> bool:
    """tools/call ended without any outcome: the server refused it with an error, or it was never sent.

    `unreachable`: why the server could not be reached at all (its last attempt); that counts against its health."""
    task = _locked(task)
    if task.status != TaskStatus.LAUNCHING:
        return False
    task.status = TaskStatus.FAILED
    task.error = error
    task.status_message = cap_status_message(str(error.get("message") or ""))
    task.finished_at = timezone.now()
    if unreachable is not None:
        task.launch_attempts += 1
        task.launch_last_error = _launch_error(unreachable)
    task.launch_next_try_at = None
    task.save(update_fields=["status", "error", "status_message", "finished_at", *LAUNCH_ATTEMPT_FIELDS, "updated_at"])
    record_event(action="task.launch_failed", actor_label=WORKER, task=task, data={"error": error, "sent": sent})
    if unreachable is not None:
        _count_against_server(task, unreachable)
    _finished(task)
    _publish_after_commit(task.id)
    return True


LAUNCH_ATTEMPT_FIELDS = ("launch_attempts", "launch_last_error", "launch_next_try_at")


def _launch_error(text: str) -> str:
    text = mask_urls_in(storable(str(text)) or "")  # a credential in a URL of the error goes no further
    if len(text) <= LAUNCH_ERROR_MAX_CHARS:
        return text
    return text[: LAUNCH_ERROR_MAX_CHARS - len(TRUNCATION_NOTE)] + TRUNCATION_NOTE


def _count_against_server(task: Task, error: str) -> None:
    """A launch that could not reach its server counts against the server's health (the servers pages, home)."""
    why = f"A launch could not reach it: {error}"
    server_services.record_server_failure(server=Server(pk=task.server_id), error=why)


def _reset_launch_attempts(task: Task) -> None:
    task.launch_attempts = 0
    task.launch_last_error = ""
    task.launch_next_try_at = None


@transaction.atomic
def record_launch_retry(*, task: Task, attempt: int, error: str, next_try_at) -> bool:
    """Attempt `attempt` of the launch (of LAUNCH_ATTEMPTS) could not reach the server, so nothing was sent;
    the job tries again at `next_try_at`. The task and its list row say so, the timeline has one entry per attempt,
    and the failure counts against the server's health. False: the task is no longer launching (cancelled, or its
    outcome recorded meanwhile), and the job must not try again."""
    task = _locked(task)
    if task.status != TaskStatus.LAUNCHING:
        return False
    task.launch_attempts = attempt
    task.launch_last_error = _launch_error(error)
    task.launch_next_try_at = next_try_at
    task.save(update_fields=[*LAUNCH_ATTEMPT_FIELDS, "updated_at"])
    record_event(
        action="task.launch_retrying",
        actor_label=WORKER,
        task=task,
        data={
            "attempt": attempt,
            "of": LAUNCH_ATTEMPTS,
            "error": task.launch_last_error,
            "next_try_at": next_try_at.isoformat() if next_try_at else None,
        },
    )
    _count_against_server(task, error)
    _publish_after_commit(task.id)
    return True


@transaction.atomic
def give_up_launch(*, task_id: uuid.UUID, attempts: int, error: BaseException) -> bool:
    """The launch job will not run again (its last attempt failed, or its worker stopped), so a task still
    launching would say so forever: its outcome is unknown if tools/call of its round was sent, else it failed.
    False: its outcome was recorded already."""
    task = Task.objects.select_for_update().filter(pk=task_id, status=TaskStatus.LAUNCHING).first()
    if task is None:
        return False
    gave_up = f"Gave up after {attempts} attempt{'' if attempts == 1 else 's'} ({str(error) or type(error).__name__})"
    if launch_was_sent(task=task):
        return mark_launch_unknown(task=task, reason=f"{gave_up}: tools/call was sent, but no answer was recorded.")
    message = f"{gave_up}: the tool call was not sent."
    return record_launch_failure(task=task, error={"message": message, "kind": type(error).__name__}, sent=False)


@transaction.atomic
def schedule_mrtr_retry(*, task: Task, mrtr_round: int) -> bool:
    """Once every request of MRTR round n is answered, the task goes back to launching to resend tools/call.

    Returns False when the round is not complete yet, is not the current one, or the task moved on.
    """
    task = _locked(task)
    if task.status != TaskStatus.INPUT_REQUIRED or task.remote_task_id is not None:
        return False
    if task.cancel_requested_at is not None:
        return False
    requests = list(task.input_requests.filter(mrtr_round__gte=mrtr_round).values_list("mrtr_round", "state"))
    if not requests or any(round_ != mrtr_round for round_, _ in requests):
        return False
    if any(state != InputRequestState.ANSWERED for _, state in requests):
        return False
    task.status = TaskStatus.LAUNCHING
    _reset_launch_attempts(task)
    task.save(update_fields=["status", *LAUNCH_ATTEMPT_FIELDS, "updated_at"])
    record_event(action="task.launch_retry_scheduled", actor_label=WORKER, task=task, data={"mrtr_round": mrtr_round})
    hooks.enqueue_launch(task.id, carries_answers=True, queue=job_queue(task.server))
    _publish_after_commit(task.id)
    return True


# --- delivery failures, local cancel, polling soon ---------------------------------------------------


@transaction.atomic
def record_delivery_failure(*, input_request: InputRequest, error: dict[str, Any]) -> None:
    """The server refused the answer (e.g. the task is gone), or could not be reached in time; the answer stays
    recorded, not delivered. The tracker polls the task at once to see where it stands."""
    task = Task.objects.select_for_update().get(pk=input_request.task_id)
    record_event(
        action="input.delivery_failed",
        actor_label=WORKER,
        task=task,
        data={"key": input_request.key, "mrtr_round": input_request.mrtr_round, "error": error},
    )
    _poll_soon(task_id=task.id)
    _publish_after_commit(task.id)


@transaction.atomic
def record_cancel_failure(*, task: Task, error: dict[str, Any]) -> None:
    """tasks/cancel was refused, could not be sent in time, or had no remote task to go to. The tracker polls the
    task at once to see where it stands."""
    task = _locked(task)
    record_event(action="task.cancel_failed", actor_label=WORKER, task=task, data={"error": error})
    _poll_soon(task_id=task.id)
    _publish_after_commit(task.id)


@transaction.atomic
def cancel_before_remote_task(*, task: Task) -> bool:
    """A cancel of a call still waiting for MRTR answers: no server task exists, so it ends here."""
    task = _locked(task)
    if task.cancel_requested_at is None:
        raise InvalidTransition(f"No cancel was requested for task {task.id}.")
    if task.status != TaskStatus.INPUT_REQUIRED or task.remote_task_id is not None:
        return False
    task.status = TaskStatus.CANCELLED
    task.finished_at = timezone.now()
    task.mrtr_request_state = None
    task.save(update_fields=["status", "finished_at", "mrtr_request_state", "updated_at"])
    record_event(
        action="task.status_changed",
        actor_label=WORKER,
        task=task,
        data={"from": TaskStatus.INPUT_REQUIRED, "to": TaskStatus.CANCELLED, "source": "cancel before any server task"},
    )
    _supersede_open_requests(task, reason="the tool call was cancelled")
    _finished(task)
    _publish_after_commit(task.id)
    return True


def _poll_soon(*, task_id: uuid.UUID) -> bool:
    """Ask the tracker to poll this task at once (after an answer or a cancel reached the server, or failed to)."""
    return bool(TaskPoll.objects.filter(task_id=task_id).update(next_poll_at=timezone.now()))


# --- retention ---------------------------------------------------------------------------------------


@transaction.atomic
def purge_finished_tasks(*, finished_before, limit: int = 500) -> int:
    """Delete up to `limit` tasks that ended before `finished_before`, with their input requests and poll rows.

    Audit rows stay (append-only); each purge adds one saying so.
    """
    tasks = list(
        Task.objects.select_for_update(skip_locked=True)
        .filter(status__in=TERMINAL_STATUSES, finished_at__lt=finished_before)
        .order_by("finished_at")
        .only("id", "server_id", "tool", "status", "finished_at")[:limit]
    )
    for task in tasks:
        record_event(
            action="task.purged",
            actor_label=WORKER,
            task=task,
            data={"tool": task.tool, "status": task.status, "finished_at": task.finished_at.isoformat()},
        )
    Task.objects.filter(pk__in=[task.pk for task in tasks]).delete()
    return len(tasks)
