"""Following a task: the snapshots the tracker reads, the input requests they open, expiry and lost tasks."""

import datetime
import json
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from taskhub.accounts import permissions
from taskhub.audit.models import AuditEvent
from taskhub.audit.services import WORKER, record_event, storable
from taskhub.mcp import schema_fields
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.models import Server
from taskhub.tasks import signals
from taskhub.tasks.errors import (
    InvalidTransition,
)
from taskhub.tasks.models import (
    TASK_PHASE,
    InputRequest,
    InputRequestState,
    Task,
    TaskPoll,
    TaskStatus,
)
from taskhub.tasks.services.common import (
    LOG_PROBLEM_MAX_CHARS,
    QUOTE_MAX_CHARS,
    SNAPSHOT_FIELDS,
    TERMINAL_FIELDS,
    _finished,
    _locked,
    _locked_with_asks,
    _log_after_commit,
    _publish_after_commit,
    _start_deadline,
    cap_status_message,
    logger,
)
from taskhub.tasks.services.delivering import _mark_delivered
from taskhub.tasks.services.progress import keep_progress_message
from taskhub.tasks.ttl import expires_at

# What a server changes to say how a task is getting on, not what it decided: the task's progress history has it
# (issue 36), the audit trail only how many there were, when the task ends.
PROGRESS_FIELDS = frozenset({"status_message", "poll_interval_ms"})


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
        task.expires_at = wanted["expires_at"]
        task.remote_last_updated_at = snapshot.last_updated_at or task.remote_last_updated_at
        if task.is_terminal:
            task.finished_at = timezone.now()
        task.status_message_is_taskhubs = False  # what the server says now (a message of its own, or none)
        progress_only = set(changed) <= PROGRESS_FIELDS
        task.progress_updates += progress_only
        task.save(
            update_fields=[
                *changed,
                "expires_at",
                "remote_last_updated_at",
                "finished_at",
                "status_message_is_taskhubs",
                "progress_updates",
                "updated_at",
            ]
        )
        data = {"source": source, "fields": changed, "status_message": task.status_message}
        if "status" in changed:
            if task.is_terminal:  # the summary of its progress: the reports themselves are not audit
                data["progress_updates"] = task.progress_updates
            record_event(
                action="task.status_changed",
                actor_label=WORKER,
                task=task,
                data={"from": previous_status, "to": task.status, **data},
            )
        elif progress_only:
            if "status_message" in changed and task.status_message:
                keep_progress_message(task_id=task.pk, number=task.progress_updates, text=task.status_message)
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
    """The columns a snapshot sets: SNAPSHOT_FIELDS and the task's end, `expires_at`, which follows from two of them
    (taskhub/tasks/ttl.py). A result on a task that is not completed (or an error on one that is not
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
        "remote_created_at": (remote_created_at := storable(snapshot.created_at) or task.remote_created_at),
        "expires_at": expires_at(remote_created_at=remote_created_at, ttl_ms=snapshot.ttl_ms),
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
    task: Task,
    requests: dict[str, dict[str, Any]],
    *,
    mrtr_round: int,
    problems: list[str],
    asked_at=None,
    fields: dict[str, Any] | None = None,
) -> list[InputRequest]:
    """Open the keys not seen before. A key already answered (or dropped) that the server asks for again is
    never reopened; that, and params taskhub cannot show, go to `problems` (the request still opens, so an
    approver can decline or cancel it and the task can move on). `fields`: more of each new row (a held question's
    holder and wait: held_questions.py)."""
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
            task=task, mrtr_round=mrtr_round, key=key, method=method, params=params, **(fields or {})
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
# pg_advisory_xact_lock(OPEN_REQUESTS_LOCK, server id): who opens requests of a server, one transaction at a time.
OPEN_REQUESTS_LOCK = 0x7A5C_0A3E


def _open_request_room(task: Task) -> int:
    """How many more open requests the task's server may have (TASKHUB_MAX_OPEN_REQUESTS_PER_SERVER).

    Counted under a lock per server held to the end of the transaction that opens them, so that tasks of one server
    opening requests at once take turns (counted without it, 8 tasks x 400 at once against a cap of 1,000 left
    2,400 open). Taken after the task's own lock, as every service locks: task first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [OPEN_REQUESTS_LOCK, task.server_id])
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
    """Open requests the server no longer lists become superseded; answered ones stay as they are. A question held
    on a session (held_questions.py) is the holder's to close, never a snapshot's: it is in no list."""
    vanished = (
        InputRequest.objects.select_for_update(no_key=True)
        .filter(task=task, state=InputRequestState.OPEN, held_by="")
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
        data={
            "from": previous_status,
            "ttl_ms": task.ttl_ms,
            "remote_created_at": task.remote_created_at,
            "progress_updates": task.progress_updates,
        },
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
    data = {
        "process_started_at": process_started_at.isoformat(),
        **({"exit": exit_detail[:500]} if exit_detail else {}),
    }
    lose(task, message=LOST_MESSAGE, data=data)
    return True


def lose(task: Task, *, message: str, data: dict[str, Any]) -> None:
    """End a live task (locked by the caller) as lost: its server no longer knows it, or nobody can reach it."""
    previous_status = task.status
    task.status = TaskStatus.LOST
    task.status_message, task.status_message_is_taskhubs = message, True
    task.finished_at = timezone.now()
    task.save(update_fields=["status", "status_message", "status_message_is_taskhubs", "finished_at", "updated_at"])
    TaskPoll.objects.filter(task=task).delete()
    record_event(
        action="task.lost",
        actor_label=WORKER,
        task=task,
        data={"from": previous_status, "message": message, "progress_updates": task.progress_updates, **data},
    )
    _supersede_open_requests(task, reason=message)
    _finished(task)
    _publish_after_commit(task.id)
