"""The approver inbox: the open input requests the user may answer, oldest first, each answered in its card; a page
at a time, filtered by server and tool, floods grouped (taskhub/tasks/inbox_listing.py).

Plain POSTs answer and redirect back (JavaScript off); htmx POSTs get the card back and swap it in place.
Refusals re-show the card with the user's input and the reasons, and record nothing.
"""

from urllib.parse import urlsplit

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_GET, require_POST

from taskhub.accounts.permissions import approver_required, may_answer, may_see_task, read_answer_rules
from taskhub.gateway.sending import answer_and_send
from taskhub.live.nav import nav_counts
from taskhub.tasks import like_requests, services
from taskhub.tasks.answers import validate_response
from taskhub.tasks.card_context import with_context
from taskhub.tasks.errors import AlreadyAnswered, AnswerRejected, InputNoLongerOpen
from taskhub.tasks.inbox_listing import InboxListing, inbox_listing
from taskhub.tasks.input_cards import (
    Card,
    card_after_answer,
    card_for,
    for_cards,
    number_siblings,
    requests_user_may_see,
    response_from_post,
    short_key,
)
from taskhub.tasks.models import InputRequest

INBOX_TEMPLATE = "tasks/inbox.html"
CARD_TEMPLATE = "tasks/input_request_card.html"
MAX_INCLUDED = 200
# A page of the inbox (taskhub/tasks/inbox_listing.py) shows this many: a page of thousands of forms helps nobody,
# and each card is about a millisecond of template rendering (100 cards were most of the inbox's time in
# bench/pages.py).
CARDS_SHOWN = 50


@approver_required
@require_GET
def inbox(request):
    # Open requests come from servers the user approves for; may_answer is therefore true for each.
    listing = inbox_listing(request.user, request.GET, page_size=CARDS_SHOWN)
    requests = listing.requests
    if request.GET.get("fragment") == "cards":
        # The live re-fetch also asks for cards already on the page, to bring their state up to date.
        included = _ids(request.GET.get("include", ""))
        shown = {ir.pk for ir in requests}
        extra = [ir for ir in for_cards(requests_user_may_see(request.user, included)) if ir.pk not in shown]
        requests = sorted(requests + extra, key=lambda ir: (ir.created_at, ir.pk))
        cards = _cards(requests, request.user, listing)
        return render(request, f"{INBOX_TEMPLATE}#card-list", _page_context(listing, cards, request.user))
    cards = _cards(requests, request.user, listing)
    return render(request, INBOX_TEMPLATE, _page_context(listing, cards, request.user))


def _cards(requests: list[InputRequest], user, listing: InboxListing) -> list[Card]:
    # The approval terms of every card, and whether they name the user, in one query, not one per server and tool.
    read_answer_rules(user, ((ir.task.server_id, ir.task.tool) for ir in requests))
    next_url = _back_to(listing)
    return with_context(number_siblings([card_for(ir, user, may_answer=True, next_url=next_url) for ir in requests]))


def _back_to(listing: InboxListing) -> str:
    """Where a plain POST's answer returns: this page of the inbox with its filters (the bare inbox needs no `next`)."""
    here = listing.query()
    return f"{reverse('tasks:inbox')}{here}" if here else ""


def _page_context(listing: InboxListing, cards, user, *, refused_group=None) -> dict:
    here = listing.query()
    groups = like_requests.like_groups(cards, user, next_url=_back_to(listing))
    if refused_group is not None:
        groups = [refused_group if group.likeness == refused_group.likeness else group for group in groups]
        if all(group.likeness != refused_group.likeness for group in groups):
            groups.insert(0, refused_group)
    return {
        "cards": cards,
        "like_groups": groups,
        "listing": listing,
        "form": listing.form,
        "more": listing.more,
        "filter_errors": list(listing.errors.values()),
        "cards_url": f"{reverse('tasks:inbox')}{here}{'&' if here else '?'}fragment=cards",
        "previous_href": listing.query(page=listing.page - 1) if listing.page > 1 else "",
        "next_href": listing.query(page=listing.page + 1) if listing.page < listing.pages else "",
        "show_disabled_href": listing.query(disabled="1", page=None),
        "clear_href": "",
        "nav_counts": SimpleLazyObject(lambda: nav_counts(user, waiting=listing.waiting)),
    }


def _ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",")[:MAX_INCLUDED] if part.strip().isdigit()]


@approver_required
@require_POST
def answer(request, request_id):
    next_url = _safe_next(request)
    try:
        # The request is read once, locked, for the checks here and for the answer (services.locked_for_answer).
        with transaction.atomic():
            try:
                input_request = services.locked_for_answer(input_request_id=request_id)
            except InputRequest.DoesNotExist:
                raise Http404("No such input request.") from None
            if not may_answer(request.user, input_request):
                # As in the API: a request whose task the user may not see does not exist for them (a 403 would say
                # it does). Asked only on refusal, so an answer costs no extra query.
                if not may_see_task(request.user, input_request.task):
                    raise Http404("No such input request.")
                raise PermissionDenied(
                    _("You do not approve for the server %(server)r.") % {"server": input_request.task.server.name}
                )
            card = card_for(input_request, request.user, may_answer=True, next_url=next_url)
            response = response_from_post(card, request.POST)
            answered = answer_and_send(
                input_request=input_request,
                response=response,
                user=request.user,
                comment=request.POST.get("comment", ""),
            )
    except AnswerRejected as refused:
        problem = (
            str(refused)
            if not refused.field_errors
            else "The answer was not sent: please correct the fields marked below."
        )
        again = card_for(
            input_request,
            request.user,
            may_answer=True,
            submitted=request.POST,
            errors=refused.field_errors,
            form_error=problem,
            next_url=next_url,
        )
        return _refused(request, again, status=400)
    except AlreadyAnswered as taken:
        input_request.refresh_from_db()
        notice = _("%(person)s answered this first; your answer was not recorded.") % {"person": taken.answered_by}
        return _refused(request, card_for(input_request, request.user, may_answer=True, notice=notice), status=409)
    except InputNoLongerOpen as gone:
        input_request.refresh_from_db()
        notice = _("%(why)s Nothing more to do here.") % {"why": gone}
        return _refused(request, card_for(input_request, request.user, may_answer=True, notice=notice), status=409)

    if request.htmx:
        return render(request, CARD_TEMPLATE, {"card": card_after_answer(card, answered, request.user)})
    if answered.state == "open":  # N of M: recorded, more acceptances needed
        messages.success(
            request,
            _("Accepted: %(count)s of the acceptances needed are in.") % {"count": len(answered.acceptances)},
        )
        return redirect(next_url or reverse("tasks:inbox"))
    action = (answered.answer or {}).get("action", "answer")
    said = {
        "accept": _("Accepted: the answer to %(server)s is recorded and being delivered."),
        "decline": _("Declined: the answer to %(server)s is recorded and being delivered."),
        "cancel": _("Cancelled: the answer to %(server)s is recorded and being delivered."),
    }.get(action, _("Answered: the answer to %(server)s is recorded and being delivered."))
    messages.success(request, said % {"server": answered.task.server.name})
    return redirect(next_url or reverse("tasks:inbox"))


def _safe_next(request) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return ""


def _refused(request, card, *, status: int):
    """htmx: the card in place (200, so htmx swaps it); a plain POST: the inbox with this card in it."""
    if request.htmx:
        return render(request, CARD_TEMPLATE, {"card": with_context([card])[0]})
    target = urlsplit(_safe_next(request))
    filters = QueryDict(target.query) if target.path == reverse("tasks:inbox") else QueryDict()
    listing = inbox_listing(request.user, filters, page_size=CARDS_SHOWN)
    cards = [card_for(ir, request.user, may_answer=True, next_url=_back_to(listing)) for ir in listing.requests]
    cards = [card if other.pk == card.pk else other for other in cards]
    if all(other.pk != card.pk for other in cards):
        cards.insert(0, card)
    with_context(number_siblings(cards))
    context = {**_page_context(listing, cards, request.user), "page_notice": card.notice or card.form_error}
    return render(request, INBOX_TEMPLATE, context, status=status)


# --- like requests, answered with one form (taskhub/tasks/like_requests.py) ----------------------------------------

FAILURES_LISTED = 10


@approver_required
@require_POST
def answer_like(request):
    """One answer for each selected request; each goes through the answer service on its own (its checks, its
    audit row, its delivery), and what fails is reported per request without undoing the others."""
    next_url = _safe_next(request)
    back = next_url or reverse("tasks:inbox")
    ids = _ids(",".join(request.POST.getlist("request")))
    if not ids:
        messages.error(request, _("Select at least one request to answer; nothing was answered."))
        return redirect(back)
    if len(ids) > like_requests.MAX_ANSWERED_AT_ONCE:
        messages.error(
            request,
            _("At most %(count)s requests can be answered at once; nothing was answered.")
            % {"count": like_requests.MAX_ANSWERED_AT_ONCE},
        )
        return redirect(back)
    # Only requests of servers the user approves for are found: others do not exist for them (as in answer()).
    chosen = list(requests_user_may_see(request.user, ids))
    missing = len(set(ids)) - len(chosen)
    if not chosen:
        messages.error(request, _("None of the selected requests is one you may answer; nothing was answered."))
        return redirect(back)
    if len({like_requests.likeness(ir) for ir in chosen}) != 1 or like_requests.likeness(chosen[0]) is None:
        messages.error(request, _("The selected requests do not all ask the same thing; nothing was answered."))
        return redirect(back)

    lead = chosen[0]
    try:
        response = response_from_post(card_for(lead, request.user, may_answer=True), request.POST)
        # The form is one for all: an answer that does not fit it fits none, so it is refused once, up front.
        response = validate_response(method=lead.method, params=lead.params, response=response, held=bool(lead.held_by))
    except AnswerRejected as refused:
        return _group_refused(request, lead, refused, next_url=next_url)

    outcomes = like_requests.answer_each(
        input_requests=chosen,
        response=response,
        user=request.user,
        may_answer=lambda input_request: may_answer(request.user, input_request),
        comment=request.POST.get("comment", ""),
    )
    waiting = [outcome for outcome in outcomes if outcome.waiting_for_more]
    done = [outcome for outcome in outcomes if outcome.answered and not outcome.waiting_for_more]
    failed = [outcome for outcome in outcomes if not outcome.answered]
    if done:
        said = _done_words(response.get("action"), len(done))  # a sampling reply: "Answered"
        messages.success(request, said % {"count": len(done), "server": lead.task.server.name})
    if waiting:
        counts = sorted(
            {_("%(accepted)s of %(required)s") % {"accepted": o.accepted, "required": o.required} for o in waiting}
        )
        said = ngettext(
            "Your acceptance is recorded for %(count)s request (%(counts)s accepted): each waits for more acceptances"
            " before anything is sent.",
            "Your acceptance is recorded for %(count)s requests (%(counts)s accepted): each waits for more acceptances"
            " before anything is sent.",
            len(waiting),
        )
        messages.success(request, said % {"count": len(waiting), "counts": ", ".join(counts)})
    if failed or missing:
        not_answered = len(failed) + missing
        lines = [_failure_line(outcome) for outcome in failed[:FAILURES_LISTED]]
        if len(failed) > FAILURES_LISTED:
            lines.append(_("and %(count)s more") % {"count": len(failed) - FAILURES_LISTED})
        if missing:
            lines.append(
                ngettext(
                    "%(count)s selected request is not among those you may answer",
                    "%(count)s selected requests are not among those you may answer",
                    missing,
                )
                % {"count": missing}
            )
        messages.error(
            request, _("%(count)s not answered: %(lines)s.") % {"count": not_answered, "lines": "; ".join(lines)}
        )
    return redirect(back)


def _failure_line(outcome: like_requests.Outcome) -> str:
    ir = outcome.input_request
    return _("request %(request)s of task %(task)s: %(problem)s") % {
        "request": short_key(ir.key, task=ir.task) or ir.pk,
        "task": str(ir.task_id)[:8],
        "problem": outcome.problem,
    }


def _done_words(action: str | None, count: int) -> str:
    if action == "accept":
        return ngettext(
            "Accepted %(count)s request from %(server)s: each answer is recorded and being delivered.",
            "Accepted %(count)s requests from %(server)s: each answer is recorded and being delivered.",
            count,
        )
    if action == "decline":
        return ngettext(
            "Declined %(count)s request from %(server)s: each answer is recorded and being delivered.",
            "Declined %(count)s requests from %(server)s: each answer is recorded and being delivered.",
            count,
        )
    if action == "cancel":
        return ngettext(
            "Cancelled %(count)s request from %(server)s: each answer is recorded and being delivered.",
            "Cancelled %(count)s requests from %(server)s: each answer is recorded and being delivered.",
            count,
        )
    return ngettext(
        "Answered %(count)s request from %(server)s: each answer is recorded and being delivered.",
        "Answered %(count)s requests from %(server)s: each answer is recorded and being delivered.",
        count,
    )


def _group_refused(request, lead: InputRequest, refused: AnswerRejected, *, next_url: str):
    """The inbox again, with the group's form showing what the person typed and what is wrong; nothing recorded."""
    problem = (
        str(refused) if not refused.field_errors else "Nothing was answered: please correct the fields marked below."
    )
    target = urlsplit(next_url)
    filters = QueryDict(target.query) if target.path == reverse("tasks:inbox") else QueryDict()
    listing = inbox_listing(request.user, filters, page_size=CARDS_SHOWN)
    cards = with_context(
        number_siblings(
            [card_for(ir, request.user, may_answer=True, next_url=_back_to(listing)) for ir in listing.requests]
        )
    )
    group = like_requests.like_groups(cards, request.user, next_url=_back_to(listing))
    likeness = like_requests.likeness(lead)
    refused_group = next((g for g in group if g.likeness == likeness), None)
    card = card_for(
        lead,
        request.user,
        may_answer=True,
        submitted=request.POST,
        errors=refused.field_errors,
        form_error=problem,
        next_url=next_url,
    )
    if refused_group is None:
        refused_group = like_requests.LikeGroup(likeness=likeness, card=card, requests=[lead])
    refused_group.card = card
    refused_group.selected = {int(pk) for pk in _ids(",".join(request.POST.getlist("request")))}
    context = _page_context(listing, cards, request.user, refused_group=refused_group)
    return render(request, INBOX_TEMPLATE, {**context, "page_notice": problem}, status=400)
