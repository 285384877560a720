"""What taskhub does when nobody answered a request by its deadline (as approvals.deadlines decided)."""

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from taskhub.audit.services import SYSTEM, record_event
from taskhub.tasks import hooks
from taskhub.tasks.errors import (
    InvalidTransition,
)
from taskhub.tasks.models import (
    InputRequest,
    InputRequestState,
    Task,
)
from taskhub.tasks.services.cancelling import request_cancel
from taskhub.tasks.services.common import _publish_after_commit
from taskhub.tasks.services.gate import _pass_gate

NO_ANSWER_IN_TIME = "no answer before the deadline"


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
    task = Task.objects.select_for_update(no_key=True, of=("self",)).select_related("server").get(pk=task_id)
    input_request = InputRequest.objects.select_for_update(no_key=True, of=("self",)).get(pk=input_request_id)
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
        return _cancel_by_default(task, input_request, data, problems, now=now)
    response = outcome.response or {"action": "decline"}
    _answer_by_default(input_request, response, now)
    hooks.hand_over_answer(input_request, server=task.server)
    return _default_applied(task, ACTION_OUTCOMES[response["action"]], {**data, "answer": response}, problems)


def _cancel_by_default(
    task: Task, input_request: InputRequest, data: dict[str, Any], problems: list[str], *, now
) -> str:
    if input_request.held_by:  # a question on a call in flight: no task to cancel; its answer is "cancel"
        _answer_by_default(input_request, {"action": "cancel"}, now)
        hooks.hand_over_answer(input_request, server=task.server)
        return _default_applied(task, "cancelled", data, problems)
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
        InputRequest.objects.select_for_update(no_key=True)
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
