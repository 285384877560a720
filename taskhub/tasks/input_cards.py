"""One input request as a card (templates/tasks/input_request_card.html), and turning a submitted card into an answer.

`card_for(input_request, user)` is what any page needs to show a request: the inbox, the task detail
page, the live fragments. It decides nothing about permission beyond reading `may_answer`; views
check permissions.may_answer before acting.
"""

import ipaddress
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.db.models import QuerySet

from taskhub.accounts import permissions
from taskhub.tasks.answers import ELICITATION_ACTIONS, content_errors
from taskhub.tasks.errors import AnswerRejected
from taskhub.tasks.models import InputRequest, InputRequestState
from taskhub.tasks.schema_forms import CANNOT_RENDER, SchemaForm, answer_form

MESSAGE_MAX_CHARS = 4000
PARAMS_MAX_CHARS = 6000
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
ACTION_WORDS = {"accept": "accepted", "decline": "declined", "cancel": "cancelled"}
OTHER_METHODS = {
    "sampling/createMessage": "asks the client's language model to write a message (sampling)",
    "roots/list": "asks for the client's file-system roots",
}


@dataclass(frozen=True)
class UrlTarget:
    url: str
    host: str
    clickable: bool
    problem: str = ""


def url_target(value: Any) -> UrlTarget:
    """Whether a URL-mode request may be opened: https anywhere, http only on a loopback host (development)."""
    url = value if isinstance(value, str) else ""
    if not url.strip():
        return UrlTarget(url=url, host="", clickable=False, problem="The server sent no URL.")
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return UrlTarget(url=url, host="", clickable=False, problem="This is not a well-formed URL.")
    if any(ch.isspace() or ord(ch) < 32 for ch in url.strip()):
        return UrlTarget(url=url, host=host, clickable=False, problem="The URL contains spaces or control characters.")
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        return UrlTarget(
            url=url,
            host=host,
            clickable=False,
            problem=f"taskhub opens only https: links, not {scheme or 'scheme-less'}: ones; "
            "decline or cancel this request.",
        )
    if not host:
        return UrlTarget(url=url, host="", clickable=False, problem="The URL names no host.")
    if scheme == "https":
        return UrlTarget(url=url, host=host, clickable=True)
    if scheme == "http" and _is_loopback(host):
        return UrlTarget(url=url, host=host, clickable=True)
    return UrlTarget(
        url=url,
        host=host,
        clickable=False,
        problem="taskhub opens only https: links (http: only on this machine, for development); "
        "decline or cancel this request.",
    )


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Card:
    input_request: InputRequest
    kind: str  # form | url | other
    state: str  # open | answered | delivered | superseded | ended
    may_answer: bool
    message: str = ""
    form: SchemaForm | None = None
    url: UrlTarget | None = None
    other_what: str = ""
    other_params: str = ""
    answered_by_you: bool = False
    answered_by_name: str = ""
    action_word: str = ""
    form_error: str = ""
    notice: str = ""
    next_url: str = ""

    @property
    def task(self):
        return self.input_request.task

    @property
    def pk(self) -> int:
        return self.input_request.pk

    @property
    def answerable(self) -> bool:
        """Buttons are shown: the request is open, the user may answer, and it is an elicitation."""
        return self.state == "open" and self.may_answer and self.kind in ("form", "url")

    @property
    def can_accept(self) -> bool:
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
    if card.kind == "form":
        card.form = answer_form(params.get("requestedSchema", {}), submitted=submitted, errors=errors)
    elif card.kind == "url":
        card.url = url_target(params.get("url"))
    else:
        card.other_what = OTHER_METHODS.get(input_request.method, "asks for something taskhub does not know")
        card.other_params = _capped(_pretty(params), PARAMS_MAX_CHARS)
    if input_request.answered_by_id is not None or input_request.state in (
        InputRequestState.ANSWERED,
        InputRequestState.DELIVERED,
    ):
        card.answered_by_you = user is not None and input_request.answered_by_id == getattr(user, "pk", None)
        answerer = input_request.answered_by
        card.answered_by_name = answerer.get_username() if answerer is not None else "a deleted user"
        answer = input_request.answer if isinstance(input_request.answer, dict) else {}
        card.action_word = ACTION_WORDS.get(answer.get("action"), "")
    return card


def _kind(input_request: InputRequest) -> str:
    if input_request.method != "elicitation/create":
        return "other"
    return "url" if input_request.mode == "url" else "form"


def _state(input_request: InputRequest) -> str:
    if input_request.state == InputRequestState.OPEN:
        return "ended" if input_request.task.is_terminal else "open"
    if input_request.state == InputRequestState.SUPERSEDED:
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


def requests_user_may_see(user, ids) -> QuerySet[InputRequest]:
    return (
        InputRequest.objects.filter(pk__in=ids, server__in=permissions.servers_user_may_approve(user))
        .select_related("task__server", "answered_by")
        .order_by("created_at", "pk")
    )


# --- a submitted card → the response to record --------------------------------------------------------


def response_from_post(card: Card, data) -> dict[str, Any]:
    """The ElicitResult to record, or AnswerRejected (with field errors) before anything is recorded."""
    action = data.get("action")
    if card.kind == "other":
        raise AnswerRejected(f"taskhub cannot answer {card.input_request.method or 'this kind of'} requests here.")
    if action not in ELICITATION_ACTIONS:
        raise AnswerRejected("Choose Accept, Decline or Cancel.")
    if action != "accept":
        return {"action": action}
    if card.kind == "url":
        if not card.url.clickable:
            raise AnswerRejected(card.url.problem or "This URL cannot be opened from taskhub; decline or cancel.")
        return {"action": "accept"}
    form = card.form
    if not form.renderable:
        raise AnswerRejected(CANNOT_RENDER)
    content, problems = form.read(data)
    if problems:
        params = card.input_request.params if isinstance(card.input_request.params, dict) else {}
        errors = content_errors(params.get("requestedSchema") or {}, content)
        raise AnswerRejected("The answer does not fit the form:", {**errors, **problems})
    return {"action": "accept", "content": content}
