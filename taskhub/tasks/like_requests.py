"""Requests that ask the same thing, answered with one form (the inbox's "asked N times" groups).

Two open requests are alike when the same server asks the same question through the same tool: the same message and
requestedSchema. Form-mode elicitations only: taskhub answers nothing else, and consent to open a URL is given one
page at a time.

Answering a group answers each request through services.answer_input, one transaction each, so each answer is
checked (its state, its policy) and audited on its own; a request that fails (answered meanwhile, withdrawn, not
the person's to answer) is reported and does not undo the others.
"""

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext

from taskhub.tasks import services
from taskhub.tasks.errors import AlreadyAnswered, TaskError
from taskhub.tasks.input_cards import Card, card_for
from taskhub.tasks.models import InputRequest, InputRequestState

MIN_GROUP = 2
# One submit answers at most this many: each is a transaction, an audit row and a delivery job of its own.
MAX_ANSWERED_AT_ONCE = 200


def likeness(input_request: InputRequest) -> str | None:
    """What makes requests alike, as a short digest; None for requests that are never grouped."""
    if input_request.method != "elicitation/create" or input_request.mode == "url":
        # A URL-mode accept is a consent to open a page, given one page at a time.
        return None
    params = input_request.params if isinstance(input_request.params, dict) else {}
    what = {
        "server": input_request.task.server_id,
        "tool": input_request.task.tool,
        "message": params.get("message"),
        "schema": params.get("requestedSchema"),
    }
    try:
        text = json.dumps(what, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass
class LikeGroup:
    likeness: str
    card: Card  # the oldest request's card: its message and the one form the group is answered with
    requests: list[InputRequest] = field(default_factory=list)
    selected: set[int] | None = None  # the ids ticked when a refused answer is shown again; None: all of them

    @property
    def count(self) -> int:
        return len(self.requests)

    @property
    def choices(self) -> list[tuple[InputRequest, bool]]:
        return [(ir, self.selected is None or ir.pk in self.selected) for ir in self.requests]


def like_groups(cards: Iterable[Card], user, *, next_url: str = "") -> list[LikeGroup]:
    """Groups of at least two answerable requests among `cards` that ask the same thing, oldest first."""
    alike: dict[str, list[InputRequest]] = {}
    for card in cards:
        if not card.answerable:
            continue
        key = likeness(card.input_request)
        if key is not None:
            alike.setdefault(key, []).append(card.input_request)
    # A lead's card only for the groups shown: the inbox's fifty cards may all ask differently.
    return [
        LikeGroup(likeness=key, card=card_for(requests[0], user, may_answer=True, next_url=next_url), requests=requests)
        for key, requests in alike.items()
        if len(requests) >= MIN_GROUP
    ]


@dataclass(frozen=True)
class Outcome:
    input_request: InputRequest
    answered: bool
    problem: str = ""
    # An acceptance recorded under an N-of-M policy before the N-th: the request stays open, nothing is sent yet.
    accepted: int = 0
    required: int = 0

    @property
    def waiting_for_more(self) -> bool:
        return self.answered and self.accepted < self.required


def answer_each(
    *,
    input_requests: list[InputRequest],
    response: dict[str, Any],
    user,
    may_answer: Callable[[InputRequest], bool],
    comment: str = "",
) -> list[Outcome]:
    """Answer each request with `response`, one service call (one transaction) each; never inside a transaction,
    so one refusal undoes nothing else. `may_answer` is the caller's permission check, asked per request.

    Each request's approval policy applies on its own (services.answer_input): a refusal (self-approval, a decline
    without the comment it asks for, not on the policy) is that request's problem; under N of M an acceptance before
    the N-th is recorded and the request stays open (Outcome.waiting_for_more). `comment` goes with every answer."""
    outcomes = []
    for input_request in input_requests:
        if not may_answer(input_request):
            problem = gettext("You do not approve for the server %(server)s.") % {
                "server": repr(input_request.task.server.name)
            }
            outcomes.append(Outcome(input_request, answered=False, problem=problem))
            continue
        try:
            recorded = services.answer_input(input_request=input_request, response=response, user=user, comment=comment)
        except AlreadyAnswered as taken:
            outcomes.append(
                Outcome(
                    input_request,
                    answered=False,
                    problem=gettext("%(person)s answered it first.") % {"person": taken.answered_by},
                )
            )
        except (TaskError, PermissionDenied) as refused:
            outcomes.append(Outcome(input_request, answered=False, problem=str(refused)))
        else:
            if recorded.state == InputRequestState.OPEN:
                terms = recorded.answer_terms
                accepted = len(recorded.acceptances)
                outcomes.append(Outcome(input_request, True, accepted=accepted, required=terms.required_accepts))
            else:
                outcomes.append(Outcome(input_request, answered=True))
    return outcomes
