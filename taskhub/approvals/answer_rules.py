"""The approval rules of one answer and one request's deadline: who may give an answer now, when N of M is reached,
when a request must be answered and when that counts as near.

The task services ask these through accounts.permissions (PolicyRules registers them at start-up), apply what they
decide and decide none of it themselves; tests/test_rules_in_approvals.py holds them to that. What a policy does at a
request's deadline is decided in approvals.deadlines, which hands the task service the outcome.
"""

import datetime
from typing import Any

from django.contrib.auth import get_user_model

from taskhub.accounts import permissions
from taskhub.accounts.permissions import AcceptanceCount, AnswerDeadline, AnswerTerms

SELF_APPROVAL_RULE = "no self-approval"
# The "deadline near" notice: in a request's last 20 % of its time, or its last 5 minutes, whichever is shorter.
DEADLINE_NEAR_SHARE = 0.2
DEADLINE_NEAR_AT_MOST = datetime.timedelta(minutes=5)


def answer_refusal(*, input_request, answer: dict[str, Any], user, terms: AnswerTerms, comment: str) -> str:
    """Why the request's policy does not let `user` give this answer now, naming the rule ("" when it does; taskhub's
    own answers, with no user, are never refused here)."""
    if user is None:
        return ""
    barred = _barred(user, input_request=input_request, terms=terms)
    if barred == ESCALATED:
        group = input_request.escalated_to.name if input_request.escalated_to else "another group"
        return (
            f"This request was escalated to {group} when nobody answered it by its deadline; only they answer it now."
        )
    if barred == NOT_NAMED:
        return f"Only {terms.answerers} may answer this request ({terms.policy})."
    if barred == LAUNCHED_IT:
        return (
            f"You launched this task, so you cannot answer its requests: {terms.policy} does not allow "
            f"self-approval (rule: {SELF_APPROVAL_RULE}). Someone else among {terms.answerers} must answer."
        )
    action = answer.get("action", "accept")  # a sampling reply (or a roots list) has none: it is an acceptance
    if action == "decline" and terms.comment_on_decline and not comment:
        return f"A decline needs a comment saying why ({terms.policy} asks for one)."
    if action == "accept" and terms.required_accepts > 1:
        earlier = input_request.acceptances or []
        if any(entry.get("user") == user.pk for entry in earlier):
            return (
                f"You accepted this request already; {terms.policy} needs {terms.required_accepts} different "
                "people to accept it."
            )
        if earlier and earlier[0].get("content") != answer.get("content"):
            return f"{earlier[0].get('name')} accepted with other values; accept with the same values, or decline."
    return ""


def launcher_barred(*, input_request, user, terms: AnswerTerms) -> bool:
    """Whether the policy's refusal of self-approval is what bars `user` from answering (their card says so)."""
    return user is not None and _barred(user, input_request=input_request, terms=terms) == LAUNCHED_IT


def count_acceptance(*, input_request, terms: AnswerTerms, acceptance: dict) -> AcceptanceCount:
    """N of M re-checks every earlier acceptance against the policy in force when another arrives: one whose giver it
    no longer allows (removed from the policy or its groups, no longer an approver, deactivated, deleted, or the
    launcher under a policy that now refuses self-approval) no longer counts toward N. With N of one, the acceptance
    is the answer and none is kept."""
    required = terms.required_accepts
    if required <= 1:
        kept = list(input_request.acceptances or [])
        return AcceptanceCount(acceptances=kept, discounted=[], enough=True, required=1)
    earlier = [entry for entry in input_request.acceptances or [] if isinstance(entry, dict)]
    givers = get_user_model().objects.in_bulk([entry.get("user") for entry in earlier if entry.get("user")])
    counted, discounted = [], []
    for entry in earlier:
        why = _why_not_counted(givers.get(entry.get("user")), input_request=input_request, terms=terms)
        if why:
            discounted.append({**entry, "why": why})
        else:
            counted.append(entry)
    acceptances = [*counted, acceptance]
    return AcceptanceCount(
        acceptances=acceptances, discounted=discounted, enough=len(acceptances) >= required, required=required
    )


def _why_not_counted(user, *, input_request, terms: AnswerTerms) -> str:
    """Why an acceptance given by `user` no longer counts under the policy in force ("" if it does)."""
    if user is None:
        return "their account was deleted"
    if not user.is_active:
        return "their account was deactivated"
    if not permissions.is_approver(user):
        return "they are no longer an approver"
    return {
        ESCALATED: "they are not in the group the request was escalated to",
        NOT_NAMED: f"{terms.policy} no longer names them (only {terms.answerers})",
        LAUNCHED_IT: f"they launched the task, and {terms.policy} does not allow self-approval",
        None: "",
    }[_barred(user, input_request=input_request, terms=terms)]


# Why a person may not answer a request under the policy in force (_barred), worded by each caller for its reader.
ESCALATED, NOT_NAMED, LAUNCHED_IT = "escalated elsewhere", "not named", "launched it"


def _barred(user, *, input_request, terms: AnswerTerms) -> str | None:
    """Whether the policy in force lets `user` answer this request at all: the escalation group only, once it was
    escalated, else those the policy names; and not its launcher where self-approval is refused. None: they may."""
    task = input_request.task
    if input_request.escalated_to_id is not None:
        if not permissions.in_escalation_group(user, input_request):
            return ESCALATED
    elif not permissions.policy_allows(user, server_id=task.server_id, tool=task.tool):
        return NOT_NAMED
    if not terms.self_approval and task.launched_by_id == user.pk:
        return LAUNCHED_IT
    return None


def answer_deadline(*, terms: AnswerTerms, opened_at: datetime.datetime) -> AnswerDeadline | None:
    """A request's deadline is counted from when it opened, and fixed then: a policy edited later moves none."""
    if terms.answer_within is None:
        return None
    at = opened_at + terms.answer_within
    return AnswerDeadline(at=at, near_at=deadline_near_at(opened_at=opened_at, deadline=at))


def deadline_near_at(*, opened_at: datetime.datetime, deadline: datetime.datetime) -> datetime.datetime:
    """In its last 20 %, or its last 5 minutes, whichever is shorter (a request given a day gets its notice 5 minutes
    before; one given 10 minutes, 2 minutes before)."""
    return deadline - min((deadline - opened_at) * DEADLINE_NEAR_SHARE, DEADLINE_NEAR_AT_MOST)
