"""The launch job's bookkeeping: the call marked sent under the task's lock, its failures and retries."""

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from taskhub.audit.models import AuditEvent
from taskhub.audit.services import GATEWAY, WORKER, record_event, storable
from taskhub.mcp.secret_urls import mask_urls_in
from taskhub.servers import services as server_services
from taskhub.servers.hooks import job_queue
from taskhub.servers.models import Server
from taskhub.tasks import hooks
from taskhub.tasks.errors import (
    InvalidTransition,
)
from taskhub.tasks.models import (
    LAUNCH_ATTEMPTS,
    LAUNCH_ERROR_MAX_CHARS,
    TRUNCATION_NOTE,
    InputRequestState,
    Task,
    TaskStatus,
)
from taskhub.tasks.services.common import (
    _finished,
    _locked,
    _publish_after_commit,
    cap_status_message,
    holds_lease,
    lease_lost,
)
from taskhub.tasks.services.following import _supersede_open_requests


@transaction.atomic
def mark_launch_unknown(*, task: Task, reason: str, sent_by_gateway: bool = False) -> bool:
    """tools/call may or may not have reached the server; shown as such and never resent by itself.
    `sent_by_gateway`: as record_launch_outcome's."""
    task = _locked(task)
    if task.status == TaskStatus.LAUNCH_UNKNOWN:
        return False
    if task.status != TaskStatus.LAUNCHING:
        raise InvalidTransition(f"Task {task.id} is {task.get_status_display()}; only a launching task can be unknown.")
    task.status = TaskStatus.LAUNCH_UNKNOWN
    task.status_message, task.status_message_is_taskhubs = cap_status_message(storable(reason)), True
    task.save(update_fields=["status", "status_message", "status_message_is_taskhubs", "updated_at"])
    record_launch_end(
        task, action="task.launch_unknown", data={"reason": task.status_message}, by_gateway=sent_by_gateway
    )
    _publish_after_commit(task.id)
    return True


def record_launch_end(task: Task, *, action: str, data: dict[str, Any], by_gateway: bool) -> None:
    """The audit row of a launch's outcome, as the worker's or, for a call the gateway sent (launch_sent_by_gateway),
    as the gateway's, whose fallback job is dropped once this commits: after the agent is told (the gateway's first
    commit hook: gateway.sending.committed_first), not a round trip to Postgres before (0.7 ms of a quick call). A
    fallback left by a process that stopped in between finds the task no longer launching and does nothing."""
    record_event(action=action, actor_label=GATEWAY if by_gateway else WORKER, task=task, data=data)
    if by_gateway:
        transaction.on_commit(lambda: hooks.drop_pending_launch(task.id), robust=True)


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
    """Whether the round's tools/call was marked sent and that mark stands: more `task.launch_sent` rows than
    `task.launch_withdrawn` ones (withdraw_launch_sent: the server refused it unrun)."""
    marks = AuditEvent.objects.filter(
        task=task, action__in=("task.launch_sent", "task.launch_withdrawn"), data__mrtr_round=mrtr_round
    ).values_list("action", flat=True)
    actions = list(marks)
    return actions.count("task.launch_sent") > actions.count("task.launch_withdrawn")


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
        held = holds_lease(lease_owner)
        task = Task.objects.select_for_update(no_key=True, of=("self",)).annotate(holds_lease=held).get(pk=task.pk)
        if not task.holds_lease:
            raise lease_lost(lease_owner, task.server_id)
    if task.status != TaskStatus.LAUNCHING:
        return None
    mrtr_round = _launch_round(task)
    if _launch_round_sent(task, mrtr_round):
        reason = "tools/call was sent, but its answer was never recorded (the process that sent it stopped)."
        mark_launch_unknown(task=task, reason=reason)
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
def withdraw_launch_sent(*, task: Task, reason: str) -> bool:
    """The server refused the round's tools/call before running it (HTTP 401 or 403: the authorization it carried
    was not enough, and taskhub needs an admin to connect the server again), so its `task.launch_sent` marker no
    longer stands: the launch waits, as one never sent does, and is sent once the server is connected again.

    Audit rows are never changed, so the marker is withdrawn by a row of its own (`task.launch_withdrawn`, read by
    _launch_round_sent). False: the task is no longer launching, or its round was not marked sent."""
    task = _locked(task)
    if task.status != TaskStatus.LAUNCHING:
        return False
    mrtr_round = _launch_round(task)
    if not _launch_round_sent(task, mrtr_round):
        return False
    task.status_message, task.status_message_is_taskhubs = cap_status_message(storable(reason)), True
    task.save(update_fields=["status_message", "status_message_is_taskhubs", "updated_at"])
    record_event(
        action="task.launch_withdrawn",
        actor_label=WORKER,
        task=task,
        data={"mrtr_round": mrtr_round, "reason": task.status_message},
    )
    _publish_after_commit(task.id)
    return True


@transaction.atomic
def hand_launch_to_worker(*, task: Task, reason: str, declares_tasks: bool) -> bool:
    """The gateway did not send a call it had marked sent (launch_sent_by_gateway): its server did not answer the
    question asked before it, so nothing went out. The marker is withdrawn, and the launch job, deferred at once in
    place of the fallback, sends it as any launch (its retries included). False: the task is no longer launching."""
    if not withdraw_launch_sent(task=task, reason=reason):
        return False
    hooks.drop_pending_launch(task.id)
    hooks.enqueue_launch(task.id, queue=job_queue(task.server), declares_tasks=declares_tasks)
    return True


@transaction.atomic
def record_launch_failure(
    *, task: Task, error: dict[str, Any], sent: bool, unreachable: str | None = None, sent_by_gateway: bool = False
) -> bool:
    """tools/call ended without any outcome: the server refused it with an error, or it was never sent.

    `unreachable`: why the server could not be reached at all (its last attempt); that counts against its health.
    `sent_by_gateway`: as record_launch_outcome's."""
    task = _locked(task)
    if task.status != TaskStatus.LAUNCHING:
        return False
    task.status = TaskStatus.FAILED
    task.error = error
    task.status_message = cap_status_message(str(error.get("message") or ""))
    task.status_message_is_taskhubs = not sent  # refused: the server's error; not sent: taskhub says why
    task.finished_at = timezone.now()
    if unreachable is not None:
        task.launch_attempts += 1
        task.launch_last_error = _launch_error(unreachable)
    task.launch_next_try_at = None
    task.save(
        update_fields=[
            "status",
            "error",
            "status_message",
            "status_message_is_taskhubs",
            "finished_at",
            *LAUNCH_ATTEMPT_FIELDS,
            "updated_at",
        ]
    )
    record_launch_end(
        task, action="task.launch_failed", data={"error": error, "sent": sent}, by_gateway=sent_by_gateway
    )
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
    task = Task.objects.select_for_update(no_key=True).filter(pk=task_id, status=TaskStatus.LAUNCHING).first()
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
