"""One input request as a card (templates/tasks/input_request_card.html), and turning a submitted card into an answer.

`card_for(input_request, user)` is what any page needs to show a request: the inbox, the task detail
page, the live fragments. It decides nothing about permission beyond reading `may_answer`; views
check permissions.may_answer before acting.
"""

import datetime
import json
import math
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from django.utils.translation import gettext, ngettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from taskhub.accounts import permissions
from taskhub.tasks.answers import ELICITATION_ACTIONS, content_errors
from taskhub.tasks.errors import AnswerRejected
from taskhub.tasks.models import GATE_METHOD, InputRequest, InputRequestState
from taskhub.tasks.sampling_cards import REPLY_MAX_CHARS, SamplingView, sampling_reply, sampling_view
from taskhub.tasks.schema_forms import CANNOT_RENDER, SchemaForm, answer_form
from taskhub.tasks.services import answerer_name
from taskhub.tasks.url_targets import UrlTarget, url_target

MESSAGE_MAX_CHARS = 4000
HEADLINE_MAX_CHARS = 160  # the message's first line, as the card's title
KEY_SHOWN_CHARS = 12  # a long key is shown by its tail, which tells one request of a task from another
TITLES_SHOWN = 6
TITLE_MAX_CHARS = 60
KEY_SEPARATORS = ":/#._-|"
PARAMS_MAX_CHARS = 6000
ACTION_WORDS = {
    "accept": pgettext_lazy("an answer's action", "accepted"),
    "decline": pgettext_lazy("an answer's action", "declined"),
    "cancel": pgettext_lazy("an answer's action", "cancelled"),
}
SAMPLING = "sampling/createMessage"
OTHER_METHODS = {
    SAMPLING: _("asks the client's language model to write a message (sampling)"),
    "roots/list": _("asks for the client's file-system roots"),
}


@dataclass(frozen=True)
class DeadlineView:
    words: str  # "answer within 4 min", "past due: taskhub applies the default now"
    state: str  # due | near | past
    at: datetime.datetime


def deadline_view(input_request: InputRequest, *, now: datetime.datetime) -> DeadlineView | None:
    """The time left to answer an open request, as of `now`: rendered on the server at each render or live update
    (the card does not tick between them)."""
    deadline = input_request.answer_deadline_at
    if deadline is None or input_request.default_applied_at is not None or input_request.state != "open":
        return None
    left = (deadline - now).total_seconds()
    if left <= 0:
        return DeadlineView(words=gettext("past due: taskhub applies the default now"), state="past", at=deadline)
    near = now >= permissions.deadline_near_at(opened_at=input_request.created_at, deadline=deadline)
    words = gettext("answer within %(time)s") % {"time": _time_left(left)}
    return DeadlineView(words=words, state="near" if near else "due", at=deadline)


def _time_left(seconds: float) -> str:
    """Rounded up, so it never promises less time than is left: 59.2 s is "60 s", 61 s is "2 min"."""
    if seconds <= 60:
        return gettext("%(seconds)s s") % {"seconds": math.ceil(seconds)}
    if seconds <= 3600:
        return gettext("%(minutes)d min") % {"minutes": math.ceil(seconds / 60)}
    if seconds <= 48 * 3600:
        return gettext("%(hours)d h") % {"hours": math.ceil(seconds / 3600)}
    days = math.ceil(seconds / 86400)
    return ngettext("%(days)d day", "%(days)d days", days) % {"days": days}


# What templates/tasks/input_request_card.html reads of the request (`ir`) and of its task (and the task's server's
# name): a kept card is kept under these (taskhub_rows.card_shown). tests/test_kept_cards.py holds the template to them.
INPUT_REQUEST_SHOWN = (
    "pk",
    "state",
    "created_at",
    "held_until",
    "key",
    "method",
    "answer",
    "answer_comment",
    "answered_at",
    "closed_reason",
)
TASK_SHOWN = ("id", "status", "tool")
# The rows a card reads beside its request's: its task and server, its answerer, the group it was escalated to.
CARD_RELATED = ("task__server", "answered_by", "escalated_to")
# What a card reads of its task and server (the template's, card_for's, the inbox's context and like groups', the
# answer rules'), so that a page of cards reads only these columns of theirs: not a task's result and error, nor a
# server's catalogue, capabilities and encrypted credentials, each decoded once per card. The request's own columns,
# and its answerer's and group's, are read whole. tests/test_inbox_pages.py holds the inbox to reading nothing more.
CARD_TASK_READS = (
    "task__id",
    "task__server",
    "task__tool",
    "task__arguments",
    "task__launched_by",
    "task__remote_task_id",
    "task__status",
    "task__status_message",
    "task__status_message_is_taskhubs",
    "task__server__name",
    "task__server__removed_at",
)


@dataclass
class Card:
    input_request: InputRequest
    kind: str  # form | url | gate | sampling | other
    state: str  # open | answered | delivered | superseded | ended | removed (its server, while it was open)
    may_answer: bool
    message: str = ""
    form: SchemaForm | None = None
    url: UrlTarget | None = None
    sampling: SamplingView | None = None
    submitted_reply: str = ""
    other_what: str = ""
    other_params: str = ""
    answered_by_you: bool = False
    answered_by_name: str = ""
    action_word: str = ""
    form_error: str = ""
    notice: str = ""
    next_url: str = ""
    headline: str = ""  # the message's first line, capped; the whole message shows below when it says more
    field_titles: list[str] | None = None
    more_fields: int = 0
    key_short: str = ""
    answerers: str = "all approvers"  # "for: …": who the request's approval policy lets answer
    required_accepts: int = 1  # N of M
    accepted_by: list[str] | None = None  # who accepted so far (N of M)
    accepted_by_you: bool = False
    # N of M: earlier acceptances that stopped counting, "name: why" (the policy in force no longer allows them)
    no_longer_counting: list[str] | None = None
    comment_on_decline: bool = False
    submitted_comment: str = ""
    gate_arguments: str = ""  # the gate before the call: the exact arguments the launch will send
    barred_as_launcher: str = ""  # the policy that refuses self-approval, when this user launched the task
    deadline: "DeadlineView | None" = None  # the answer deadline of an open request, as it stands at this render
    escalated_to: str = ""  # the group a request was handed to at its deadline
    ordinal: int = 0  # "request 1 of 3" when the page shows several requests of one task (number_siblings)
    siblings: int = 0
    context: Any = None  # card_context.CardContext: the inbox's "launched with" and "before this question"

    @property
    def message_says_more(self) -> bool:
        return self.message.strip() != self.headline

    @property
    def task(self):
        return self.input_request.task

    @property
    def pk(self) -> int:
        return self.input_request.pk

    @property
    def answerable(self) -> bool:
        """Buttons are shown: the request is open, the user may answer, and it is an elicitation."""
        return self.state == "open" and self.may_answer and self.kind in ("form", "url", "gate", "sampling")

    @property
    def can_decline(self) -> bool:
        """A task's own sampling request (the extension's) has no way to say no; the rest have."""
        return self.kind != "sampling" or bool(self.input_request.held_by)

    @property
    def can_accept(self) -> bool:
        if self.kind in ("gate", "sampling"):
            return True
        if self.kind == "form":
            return self.form is not None and self.form.renderable
        if self.kind == "url":
            return self.url is not None and self.url.clickable
        return False


def card_for(
    input_request: InputRequest,
    user,
    *,
    may_answer: bool | None = None,
    submitted=None,
    errors: dict[str, str] | None = None,
    form_error: str = "",
    notice: str = "",
    next_url: str = "",
) -> Card:
    """The card of one request for one user; `submitted`/`errors` re-show a refused answer with the user's input."""
    params = input_request.params if isinstance(input_request.params, dict) else {}
    if may_answer is None:
        may_answer = permissions.may_answer(user, input_request)
    card = Card(
        input_request=input_request,
        kind=_kind(input_request),
        state=_state(input_request),
        may_answer=may_answer,
        message=_capped(params.get("message"), MESSAGE_MAX_CHARS),
        form_error=form_error,
        notice=notice,
        next_url=next_url,
    )
    card.headline = headline(card.message)
    if submitted is not None:
        card.submitted_comment = str(submitted.get("comment", ""))[:2000]
    card.key_short = short_key(input_request.key, task=input_request.task)
    if card.kind == "form":
        card.form = answer_form(params.get("requestedSchema", {}), submitted=submitted, errors=errors)
        if card.form.renderable:
            titles = [_capped(field.label, TITLE_MAX_CHARS) for field in card.form.fields]
            card.field_titles, card.more_fields = titles[:TITLES_SHOWN], max(0, len(titles) - TITLES_SHOWN)
    elif card.kind == "url":
        card.url = url_target(params.get("url"))
    elif card.kind == "gate":
        card.gate_arguments = _capped(_pretty(input_request.task.arguments), PARAMS_MAX_CHARS)
    elif card.kind == "sampling":
        card.sampling = sampling_view(params)
        if submitted is not None:
            card.submitted_reply = str(submitted.get("reply", ""))[:REPLY_MAX_CHARS]
    else:
        card.other_what = OTHER_METHODS.get(input_request.method, gettext("asks for something taskhub does not know"))
        card.other_params = _capped(_pretty(params), PARAMS_MAX_CHARS)
    _show_state(card, input_request, user)
    return card


def card_after_answer(card: Card, input_request: InputRequest, user) -> Card:
    """`card`, built for the form just answered, showing `input_request` as the answer left it (the answer view: the
    card is not built twice). What the request asks (its message, form, key) does not change with an answer and stays
    as built; its state, terms, acceptances and answerer are taken from `input_request`."""
    card.input_request = input_request
    card.state = _state(input_request)
    _show_state(card, input_request, user)
    return card


def _show_state(card: Card, input_request: InputRequest, user) -> None:
    """What changes with answers: the policy's terms, escalation, deadline, acceptances and who answered."""
    terms = getattr(input_request, "answer_terms", None) or permissions.answer_terms(
        server_id=input_request.task.server_id, tool=input_request.task.tool
    )
    card.answerers, card.required_accepts = terms.answerers, terms.required_accepts
    card.comment_on_decline = terms.comment_on_decline
    if card.may_answer and permissions.launcher_barred(input_request=input_request, user=user, terms=terms):
        # The answer service would refuse it: no form to fill in for nothing.
        card.may_answer, card.barred_as_launcher = False, terms.policy or "its approval policy"
    if input_request.escalated_to_id is not None:
        card.escalated_to = input_request.escalated_to.name if input_request.escalated_to else "a removed group"
    card.deadline = deadline_view(input_request, now=timezone.now())
    acceptances = input_request.acceptances if isinstance(input_request.acceptances, list) else []
    card.accepted_by = [str(entry.get("name", "")) for entry in acceptances if isinstance(entry, dict)]
    card.accepted_by_you = any(
        isinstance(entry, dict) and entry.get("user") == getattr(user, "pk", None) for entry in acceptances
    )
    discounted = input_request.discounted_acceptances
    card.no_longer_counting = [
        f"{entry.get('name', '')}'s acceptance no longer counts: {entry.get('why', '')}"
        for entry in (discounted if isinstance(discounted, list) else [])
        if isinstance(entry, dict)
    ]
    if input_request.answered_by_id is not None or input_request.state in (
        InputRequestState.ANSWERED,
        InputRequestState.DELIVERED,
    ):
        card.answered_by_you = user is not None and input_request.answered_by_id == getattr(user, "pk", None)
        card.answered_by_name = answerer_name(input_request)
        answer = input_request.answer if isinstance(input_request.answer, dict) else {}
        card.action_word = ACTION_WORDS.get(
            answer.get("action"), gettext("replied") if answer.get("role") == "assistant" else ""
        )


def headline(message: str) -> str:
    """The first non-empty line of a server's message, capped: what a card leads with."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return _capped(first, HEADLINE_MAX_CHARS)


def short_key(key: str, *, task) -> str:
    """A request key as short as it can be and still tell the task's requests apart: without the task's own id in
    front (servers mint `<taskId>:<hash>`), and a long rest by its tail."""
    rest = key or ""
    for task_id in (task.remote_task_id, str(task.pk)):
        if task_id and rest.startswith(task_id) and len(rest) > len(task_id) and rest[len(task_id)] in KEY_SEPARATORS:
            rest = rest[len(task_id) + 1 :]
            break
    if len(rest) <= KEY_SHOWN_CHARS + 4:
        return rest
    return "…" + rest[-KEY_SHOWN_CHARS:]


def number_siblings(cards: list[Card]) -> list[Card]:
    """Numbers the cards of one task that a page shows together ("request 2 of 3"), oldest first; a task's
    only card is not numbered. Reads nothing: the cards are the page's."""
    by_task: dict = {}
    for card in cards:
        by_task.setdefault(card.input_request.task_id, []).append(card)
    for group in by_task.values():
        if len(group) < 2:
            continue
        ordered = sorted(group, key=lambda card: (card.input_request.created_at, card.input_request.pk))
        for number, card in enumerate(ordered, start=1):
            card.ordinal, card.siblings = number, len(group)
    return cards


def _kind(input_request: InputRequest) -> str:
    if input_request.method == GATE_METHOD:
        return "gate"
    if input_request.method == SAMPLING:
        return "sampling"
    if input_request.method != "elicitation/create":
        return "other"
    return "url" if input_request.mode == "url" else "form"


def _state(input_request: InputRequest) -> str:
    if input_request.state == InputRequestState.OPEN:
        if input_request.task.is_terminal:
            return "ended"
        return "removed" if input_request.task.server.removed_at is not None else "open"
    if input_request.state == InputRequestState.SUPERSEDED:
        if input_request.closed_reason:  # taskhub closed it, and says why (a held question: tasks/services)
            return "closed"
        return "ended" if input_request.task.is_terminal else "superseded"
    return str(input_request.state)


def _capped(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pretty(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


# --- which requests -----------------------------------------------------------------------------------


def for_cards(requests: QuerySet[InputRequest]) -> QuerySet[InputRequest]:
    """`requests` with what their cards read of them, their tasks and servers, their answerers and groups."""
    own = tuple(field.name for field in InputRequest._meta.concrete_fields)
    return requests.select_related(*CARD_RELATED).only(*own, *CARD_TASK_READS)


def requests_user_may_see(user, ids) -> QuerySet[InputRequest]:
    return (
        InputRequest.objects.filter(
            permissions.requests_user_may_answer(user),
            pk__in=ids,
            server__in=permissions.servers_user_may_approve(user),
        )
        .select_related(*CARD_RELATED)
        .order_by("created_at", "pk")
    )


# --- a submitted card → the response to record --------------------------------------------------------


def response_from_post(card: Card, data) -> dict[str, Any]:
    """The ElicitResult to record, or AnswerRejected (with field errors) before anything is recorded."""
    action = data.get("action")
    if card.state == "removed":
        raise AnswerRejected(
            gettext("The server %(server)s was removed; it takes no answers any more.")
            % {"server": card.task.server.name}
        )
    if card.kind == "other":
        raise AnswerRejected(f"taskhub cannot answer {card.input_request.method or 'this kind of'} requests here.")
    if action not in ELICITATION_ACTIONS:
        raise AnswerRejected(gettext("Choose Accept, Decline or Cancel."))
    if card.kind == "sampling":
        return sampling_reply(data) if action == "accept" else {"action": action}
    if action != "accept" or card.kind == "gate":
        return {"action": action}
    if card.kind == "url":
        if not card.url.clickable:
            raise AnswerRejected(
                card.url.problem or gettext("This URL cannot be opened from taskhub; decline or cancel.")
            )
        return {"action": "accept"}
    form = card.form
    if not form.renderable:
        raise AnswerRejected(str(CANNOT_RENDER))
    content, problems = form.read(data)
    if problems:
        params = card.input_request.params if isinstance(card.input_request.params, dict) else {}
        errors = content_errors(params.get("requestedSchema") or {}, content)
        raise AnswerRejected(gettext("The answer does not fit the form:"), {**errors, **problems})
    return {"action": "accept", "content": content}
