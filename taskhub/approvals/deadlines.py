"""Answer deadlines: what an approval policy does when nobody answered a request in time, and the notices around it.

A request's deadline is fixed when it opens (answer_rules.answer_deadline, asked by the task services); two jobs look
at it then, one when the deadline is near and one when it passes (taskhub.answer_deadline, deferred at those
moments), and a sweep every minute catches whatever they missed. Both call check_deadline, which is safe to repeat:
the default is applied once (tasks.services.apply_deadline_default locks the request) and the "near" notice is sent
once (a column).

What happens at the deadline is what the request's policy says then (outcome_at_deadline decides it; the task service
does it); if the policy was removed meanwhile, or no longer sets a deadline, the request is declined (its deadline
still holds: a policy edited later moves no deadline already running).
"""

import datetime

from django.db import transaction
from django.utils import timezone

from taskhub.approvals import signals
from taskhub.approvals.answer_rules import DEADLINE_NEAR_AT_MOST, deadline_near_at
from taskhub.approvals.models import AtDeadline
from taskhub.approvals.rules import effective_policy
from taskhub.tasks import services as task_services
from taskhub.tasks.answers import validate_response
from taskhub.tasks.errors import AnswerRejected
from taskhub.tasks.models import GATE_METHOD, TERMINAL_STATUSES, InputRequest, InputRequestState

SWEEP_BATCH = 500


def outcome_at_deadline(input_request: InputRequest) -> task_services.DeadlineOutcome:
    """What the request's policy does now that nobody answered it in time. The gate before a call is never passed by a
    default: whatever the policy says, the launch is not sent. A default that cannot be done is replaced, with why: an
    escalation group removed since, or a fixed answer that does not fit the request's form, by a decline; a request
    that cannot be declined, by cancelling the task."""
    policy = effective_policy(input_request.server_id, input_request.task.tool)
    if policy is None or policy.answer_within is None:
        at_deadline, answer, group = AtDeadline.DECLINE.value, None, None
    else:
        at_deadline, answer, group = policy.at_deadline, policy.deadline_answer, policy.escalation_group
    decided = dict(
        policy_id=policy.pk if policy else None,
        at_deadline=at_deadline,
        required_accepts=policy.required_accepts if policy else 1,
    )
    problems: list[str] = []
    if at_deadline == AtDeadline.ESCALATE and group is None:
        problems.append("the policy escalates to a group that no longer exists; declined instead")
        at_deadline = AtDeadline.DECLINE.value
    if at_deadline == AtDeadline.ESCALATE:
        return task_services.DeadlineOutcome(**decided, action="escalate", group=group)
    if input_request.method == GATE_METHOD:
        return task_services.DeadlineOutcome(**decided, action="not_approved", problems=tuple(problems))
    if at_deadline == AtDeadline.CANCEL:
        return task_services.DeadlineOutcome(**decided, action="cancel", problems=tuple(problems))
    response = {"action": "decline"}
    if at_deadline == AtDeadline.ANSWER:
        try:
            response = _fitting(input_request, answer)
        except AnswerRejected as rejected:
            problems.append(f"the fixed answer does not fit this request ({rejected}); declined instead")
    try:
        response = _fitting(input_request, response)
    except AnswerRejected:
        problems.append(f"a {input_request.method or 'request'} cannot be declined; the task is cancelled instead")
        return task_services.DeadlineOutcome(**decided, action="cancel", problems=tuple(problems))
    return task_services.DeadlineOutcome(**decided, action="answer", response=response, problems=tuple(problems))


def _fitting(input_request: InputRequest, response) -> dict:
    return validate_response(
        method=input_request.method,
        params=input_request.params,
        response=response,
        held=bool(input_request.held_by),
    )


def check_deadline(*, input_request_id: int, now: datetime.datetime | None = None) -> str | None:
    """Send the "deadline near" notice, or apply the default, if either is due now. Returns what was done at the
    deadline (tasks.services.apply_deadline_default), or None."""
    now = now or timezone.now()
    input_request = (
        InputRequest.objects.select_related("task")
        .filter(pk=input_request_id, state=InputRequestState.OPEN, default_applied_at__isnull=True)
        .exclude(answer_deadline_at__isnull=True)
        .first()
    )
    if input_request is None:
        return None
    if input_request.answer_deadline_at > now:
        _send_near_if_due(input_request, now=now)
        return None
    decided = outcome_at_deadline(input_request)
    with transaction.atomic():
        outcome = task_services.apply_deadline_default(input_request_id=input_request.pk, outcome=decided, now=now)
        if outcome is not None:
            transaction.on_commit(
                lambda: signals.default_applied.send_robust(
                    sender=None, input_request_id=input_request.pk, policy_id=decided.policy_id, outcome=outcome
                )
            )
    return outcome


def _send_near_if_due(input_request: InputRequest, *, now: datetime.datetime) -> bool:
    with transaction.atomic():
        near_at = deadline_near_at(opened_at=input_request.created_at, deadline=input_request.answer_deadline_at)
        if not task_services.mark_deadline_near(input_request_id=input_request.pk, near_at=near_at, now=now):
            return False
        policy = effective_policy(input_request.server_id, input_request.task.tool)
        deadline = input_request.answer_deadline_at
        transaction.on_commit(
            lambda: signals.deadline_near.send_robust(
                sender=None,
                input_request_id=input_request.pk,
                policy_id=policy.pk if policy else None,
                deadline=deadline,
            )
        )
    return True


def sweep(*, now: datetime.datetime | None = None) -> int:
    """Every open request whose deadline is near or past and not yet acted on; how many defaults were applied."""
    now = now or timezone.now()
    due = (
        InputRequest.objects.filter(
            state=InputRequestState.OPEN,
            default_applied_at__isnull=True,
            answer_deadline_at__lte=now + DEADLINE_NEAR_AT_MOST,
            server__removed_at__isnull=True,
        )
        .exclude(task__status__in=TERMINAL_STATUSES)
        .order_by("answer_deadline_at")
        .values_list("pk", "answer_deadline_at", "deadline_near_sent_at")[:SWEEP_BATCH]
    )
    applied = 0
    for pk, deadline, near_sent in list(due):
        if deadline > now and near_sent is not None:
            continue
        applied += check_deadline(input_request_id=pk, now=now) is not None
    return applied
