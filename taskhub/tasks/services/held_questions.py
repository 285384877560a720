"""Questions asked on the session of a call in flight (a classic `elicitation/create`): held by the worker that holds
the call, answered by a person like any other input request, and sent back by that worker on the session itself.

The request opens as the Tasks extension's do (`_open_requests`: its audit row, the policy's deadline and
notifications, the server's cap) with `held_by` and `held_until` set. An answer to it (a person's, or the policy's
default at its deadline) wakes the holding worker (`hooks.wake_held_question`) instead of deferring a delivery job;
the worker sends it as the JSON-RPC response and records it delivered. A question closes unanswered, with the reason
on its card and in the audit trail, when the wait runs out (the server is told "cancel"), when the call ends first
(the server stopped waiting, the connection or process went), or when the worker holding it is found dead
(heartbeats): never an answer sent twice, never a card left open that nobody can answer.
"""

import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from taskhub.audit.services import WORKER, record_event
from taskhub.tasks.errors import InvalidTransition
from taskhub.tasks.models import TASK_PHASE, InputRequest, InputRequestState, Task
from taskhub.tasks.services.common import _publish_after_commit
from taskhub.tasks.services.delivering import _mark_delivered
from taskhub.tasks.services.following import _open_requests, _record_problems

# The key of a held question: the server's JSON-RPC id of its request, unique on the call's session.
HELD_KEY_PREFIX = "call:"
WAIT_RAN_OUT = "Nobody answered within {wait}: taskhub told the server the question was cancelled."
CALL_ENDED = (
    "The call that asked this ended before an answer was sent (the server stopped waiting, or the connection or the"
    " server's process went); nothing was sent."
)
COMPLETED_AT_LINK = (
    "The server said the interaction at this link was completed (notifications/elicitation/complete) before anyone"
    " answered here: taskhub told it the person accepted."
)
WORKER_GONE = "The worker holding the call that asked this stopped; the question can no longer be answered."


def question_wait(server) -> datetime.timedelta:
    seconds = server.question_wait_seconds or settings.TASKHUB_QUESTION_WAIT_SECONDS
    return datetime.timedelta(seconds=seconds)


@transaction.atomic
def open_held_question(
    *, task_id, method: str, params: dict[str, Any], server_request_id: str | int, held_by: str
) -> InputRequest | None:
    """The question as an input request on the task, held by `held_by`; None when the task takes no more questions
    (it ended, or the server is over its cap of open requests: the caller answers "cancel")."""
    task = Task.objects.select_for_update(no_key=True, of=("self",)).select_related("server").get(pk=task_id)
    if task.is_terminal:
        return None
    problems: list[str] = []
    key = f"{HELD_KEY_PREFIX}{server_request_id}"[:500]
    held = {"held_by": held_by, "held_until": timezone.now() + question_wait(task.server)}
    requests = {key: {"method": method, "params": params}}
    opened = _open_requests(task, requests, mrtr_round=TASK_PHASE, problems=problems, fields=held)
    _record_problems(task, problems, source=method)
    if not opened:
        return None
    _publish_after_commit(task.id, server_id=task.server_id, asks=True)
    return opened[0]


def held_question(*, input_request_id: int) -> InputRequest:
    return InputRequest.objects.get(pk=input_request_id)


@transaction.atomic
def record_held_answer_sent(*, input_request_id: int) -> bool:
    """The holding worker hands the answer to the session (its JSON-RPC response goes out next): delivered."""
    input_request = InputRequest.objects.only("pk", "task_id").get(pk=input_request_id)
    try:
        return _mark_delivered(input_request=input_request, confirmed_by="sent as the response on the call's session")
    except InvalidTransition:  # closed meanwhile (its worker was taken for dead): nothing is sent
        return False


OPEN_OR_ANSWERED = (InputRequestState.OPEN, InputRequestState.ANSWERED)
OPEN_ONLY = (InputRequestState.OPEN,)


@transaction.atomic
def close_held_question(*, input_request_id: int, reason: str, was: tuple[str, ...] = OPEN_OR_ANSWERED) -> bool:
    """Close a held question whose answer will never reach the server (open, or answered and not sent: `was`);
    False when it is in none of the states of `was` (closed or delivered already)."""
    input_request = InputRequest.objects.filter(pk=input_request_id).only("task_id").first()
    if input_request is None:
        return False
    task = Task.objects.select_for_update(no_key=True, of=("self",)).get(pk=input_request.task_id)
    input_request = InputRequest.objects.select_for_update(no_key=True).get(pk=input_request_id)
    if input_request.state not in was:
        return False
    was_state = input_request.state
    input_request.state = InputRequestState.SUPERSEDED
    input_request.closed_reason = reason
    input_request.save(update_fields=["state", "closed_reason"])
    record_event(
        action="input.superseded",
        actor_label=WORKER,
        task=task,
        data={"key": input_request.key, "mrtr_round": input_request.mrtr_round, "reason": reason, "was": was_state},
    )
    _publish_after_commit(task.id, server_id=task.server_id, asks=True)
    return True


def close_completed_at_link(*, input_request_id: int) -> bool:
    """A URL-mode question the server says was completed at its link: closed with that reason, its "accept" sent
    and recorded delivered; False when it was answered or closed meanwhile (a person's answer goes instead)."""
    return close_held_question(input_request_id=input_request_id, reason=COMPLETED_AT_LINK, was=OPEN_ONLY)


def close_questions_held_by(*, worker_ids: list[str]) -> int:
    """The questions held by workers found dead (heartbeats): each closed with the reason."""
    held = InputRequest.objects.filter(
        held_by__in=worker_ids, state__in=(InputRequestState.OPEN, InputRequestState.ANSWERED)
    ).values_list("pk", flat=True)
    return sum(close_held_question(input_request_id=pk, reason=WORKER_GONE) for pk in list(held))
