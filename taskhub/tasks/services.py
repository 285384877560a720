"""Every change to a Task or an InputRequest. Views, jobs and the tracker call these; nothing else writes the models.

Each service is one transaction that writes the state, its audit row(s) and the hand-off to a job
together (hooks.py), and announces the change after commit (signals.py; the live layer listens). Rows are
locked task first, then input requests.
"""

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from taskhub.audit.models import AuditEvent
from taskhub.audit.services import WORKER, record_event, storable
from taskhub.mcp import schema_fields
from taskhub.mcp.client import CallOutcome, TaskCreated, ToolCompleted, ToolInputRequired
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.catalogue import find_tool
from taskhub.servers.models import Server
from taskhub.tasks import hooks, signals, storable_text
from taskhub.tasks.answers import validate_response
from taskhub.tasks.errors import (
    AlreadyAnswered,
    AnswerRejected,
    ArgumentsRejected,
    InputNoLongerOpen,
    InvalidTransition,
    LaunchRefused,
    TaskAlreadyFinished,
    UnknownTool,
)
from taskhub.tasks.models import (
    LIVE_STATUSES,
    STATUS_MESSAGE_MAX_CHARS,
    TASK_PHASE,
    TERMINAL_STATUSES,
    TRUNCATION_NOTE,
    InputRequest,
    InputRequestState,
    Task,
    TaskPoll,
    TaskStatus,
)

# What apply_snapshot compares. lastUpdatedAt is left out on purpose: some peers bump it on every
# read, so it is stored only along with a real change.
SNAPSHOT_FIELDS = ("status", "status_message", "result", "error", "ttl_ms", "poll_interval_ms", "remote_created_at")
TERMINAL_FIELDS = ("status", "result", "error")
# What a protocol error note quotes of a stored or received value, at most (as JSON).
QUOTE_MAX_CHARS = 500


def cap_status_message(text: str | None) -> str:
    text = text or ""
    if len(text) <= STATUS_MESSAGE_MAX_CHARS:
        return text
    return text[: STATUS_MESSAGE_MAX_CHARS - len(TRUNCATION_NOTE)] + TRUNCATION_NOTE


def _publish_after_commit(task_id: uuid.UUID) -> None:
    signals.announce_task_changed(task_id)


def _locked(task: Task) -> Task:
    return Task.objects.select_for_update().get(pk=task.pk)


# --- launching --------------------------------------------------------------------------------------


def check_launch(*, server: Server, tool: str, arguments: Any) -> None:
    """Raise LaunchRefused unless `tool` is in the server's discovered catalogue and `arguments` fit its
    inputSchema. `launch` calls it; a form that could not read some fields asks it about the others."""
    entry = find_tool(server, tool)
    if entry is None:
        raise UnknownTool(
            f"The server {server.name} has no tool {tool[:200]!r} in its catalogue (discover it again if it is new)."
        )
    # Unstorable text first: a lone surrogate would also fail the schema's checks, with a message that hides why.
    unstorable = storable_text.unstorable_fields(arguments) if isinstance(arguments, dict) else {}
    if unstorable:
        raise ArgumentsRejected("The arguments contain text that cannot be stored:", unstorable)
    errors = schema_fields.validate(entry.input_schema, arguments, schema_fields.TOOL)
    if errors:
        raise LaunchRefused("The arguments do not fit the tool's input schema:", errors)


@transaction.atomic
def launch(*, server: Server, tool: str, arguments: dict[str, Any], user) -> Task:
    """Write the task before anything is sent, so a crash can never lose a launched call unnoticed.

    Only a tool of the server's catalogue, with arguments that fit its inputSchema (LaunchRefused if not).
    """
    server = Server.objects.get(pk=server.pk)  # the caller's copy may be stale
    if not server.enabled:
        raise InvalidTransition(f"The server {server.name!r} is disabled; enable it before launching tools on it.")
    check_launch(server=server, tool=tool, arguments=arguments)
    task = Task.objects.create(server=server, tool=tool, arguments=arguments, launched_by=user)
    record_event(
        action="task.launched",
        user=user,
        task=task,
        server=server,
        data={"tool": tool, "arguments": arguments, "server": server.name},
    )
    hooks.enqueue_launch(task.id)
    _publish_after_commit(task.id)
    return task


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
    task = _locked(task)
    if task.remote_task_id is None:
        raise InvalidTransition(f"Task {task.id} has no remote task yet; nothing to apply a snapshot to.")
    if snapshot.task_id != task.remote_task_id:
        raise InvalidTransition(f"Snapshot of remote task {snapshot.task_id!r} given for task {task.id}.")
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
        if task.is_terminal:
            TaskPoll.objects.filter(task=task).delete()

    outstanding = (snapshot.input_requests or {}) if snapshot.status == TaskStatus.INPUT_REQUIRED else {}
    outstanding = storable(outstanding)
    superseded = _supersede_open_requests(task, keep=set(outstanding), reason=f"no longer asked for ({source})")
    confirmed = _confirm_interrupted_deliveries(task, keep=set(outstanding), asked_at=asked_at)
    opened = _open_requests(task, outstanding, mrtr_round=TASK_PHASE, problems=problems, asked_at=asked_at)
    _record_problems(task, problems, source=source)
    anything = bool(changed or superseded or confirmed or opened)
    if anything:
        _publish_after_commit(task.id)
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
    return True


def _open_requests(
    task: Task, requests: dict[str, dict[str, Any]], *, mrtr_round: int, problems: list[str], asked_at=None
) -> list[InputRequest]:
    """Open the keys not seen before. A key already answered (or dropped) that the server asks for again is
    never reopened; that, and params taskhub cannot show, go to `problems` (the request still opens, so an
    approver can decline or cancel it and the task can move on)."""
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
    if refused_over_cap:
        _refuse_over_cap(task, refused=refused_over_cap)
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


@transaction.atomic
def answer_input(*, input_request: InputRequest, response: dict[str, Any], user) -> InputRequest:
    """Record one person's answer; the delivery job sends it. One answer per key, whoever clicks first."""
    # Lock order task → input request, as apply_snapshot does; the second of two answers waits here.
    task = Task.objects.select_for_update(of=("self",)).select_related("server").get(pk=input_request.task_id)
    input_request = (
        InputRequest.objects.select_for_update(of=("self",)).select_related("answered_by").get(pk=input_request.pk)
    )
    if input_request.state in (InputRequestState.ANSWERED, InputRequestState.DELIVERED):
        raise AlreadyAnswered(
            key=input_request.key,
            answered_by=_name(input_request.answered_by),
            answered_at=input_request.answered_at,
        )
    if input_request.state == InputRequestState.SUPERSEDED:
        raise InputNoLongerOpen(f"The server no longer asks {input_request.key!r}; the answer was not recorded.")
    if task.is_terminal:
        raise InputNoLongerOpen(f"The task is {task.get_status_display()}; it takes no more answers.")
    _refuse_unstorable_answer(response)
    answer = validate_response(method=input_request.method, params=input_request.params, response=response)
    input_request.state = InputRequestState.ANSWERED
    input_request.answer = answer
    input_request.answered_by = user
    input_request.answered_at = timezone.now()
    input_request.save(update_fields=["state", "answer", "answered_by", "answered_at"])
    record_event(
        action="input.answered",
        user=user,
        task=task,
        data={"key": input_request.key, "mrtr_round": input_request.mrtr_round, "answer": answer},
    )
    hooks.enqueue_answer_delivery(input_request.pk)
    _publish_after_commit(task.id)
    input_request.task = task  # as locked, with its server: the caller shows the answered card without reading again
    return input_request


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


def claim_delivery(*, input_request: InputRequest) -> bool:
    """Commit, before sending, that this answer may reach the server (see InputRequest.delivery_attempted_at).

    A compare-and-set on the attempt time the caller read: of two jobs delivering one answer at once (a job
    recovered as stalled while its worker still runs it), only one may send. False: another attempt won.
    """
    claimed = InputRequest.objects.filter(
        pk=input_request.pk,
        state=InputRequestState.ANSWERED,
        delivery_attempted_at=input_request.delivery_attempted_at,
    ).update(delivery_attempted_at=timezone.now())
    return claimed == 1


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
    _publish_after_commit(task.id)
    return True


# --- cancel and expiry ------------------------------------------------------------------------------


@transaction.atomic
def request_cancel(*, task: Task, user) -> Task:
    """Record the wish to cancel; the cancel job sends tasks/cancel. Asking twice is asking once."""
    task = _locked(task)
    if task.is_terminal:
        raise TaskAlreadyFinished(f"The task is already {task.get_status_display()}; there is nothing to cancel.")
    if task.status == TaskStatus.LAUNCH_UNKNOWN:
        raise InvalidTransition(
            "The launch outcome is unknown, so there is no remote task to cancel; check the server directly."
        )
    if task.cancel_requested_at is not None:
        return task
    task.cancel_requested_at = timezone.now()
    task.cancel_requested_by = user
    task.save(update_fields=["cancel_requested_at", "cancel_requested_by", "updated_at"])
    record_event(action="task.cancel_requested", user=user, task=task, data={"status": task.status})
    hooks.enqueue_cancel_delivery(task.id)
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
    _supersede_open_requests(task, reason="the task expired")
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
def mark_launch_sent(*, task: Task) -> LaunchCall | None:
    """Record that tools/call is about to be sent, and return what to send; None when it must not be sent.

    The `task.launch_sent` audit row of the round is the marker: audit rows can never be changed or
    deleted, so once it is committed no job will send that round again. A job that finds the marker
    (it crashed after this point, or is a duplicate) makes the launch outcome unknown instead.
    """
    task = _locked(task)
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
def record_launch_failure(*, task: Task, error: dict[str, Any], sent: bool) -> bool:
    """tools/call ended without any outcome: the server refused it with an error, or it was never sent."""
    task = _locked(task)
    if task.status != TaskStatus.LAUNCHING:
        return False
    task.status = TaskStatus.FAILED
    task.error = error
    task.status_message = cap_status_message(str(error.get("message") or ""))
    task.finished_at = timezone.now()
    task.save(update_fields=["status", "error", "status_message", "finished_at", "updated_at"])
    record_event(action="task.launch_failed", actor_label=WORKER, task=task, data={"error": error, "sent": sent})
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
    task.save(update_fields=["status", "updated_at"])
    record_event(action="task.launch_retry_scheduled", actor_label=WORKER, task=task, data={"mrtr_round": mrtr_round})
    hooks.enqueue_launch(task.id, carries_answers=True)
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
