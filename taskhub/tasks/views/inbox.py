"""The approver inbox: the open input requests the user may answer, oldest first, each answered in its card; a page
at a time, filtered by server and tool, floods grouped (taskhub/tasks/inbox_listing.py).

Plain POSTs answer and redirect back (JavaScript off); htmx POSTs get the card back and swap it in place.
Refusals re-show the card with the user's input and the reasons, and record nothing.
"""

from urllib.parse import urlsplit

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from taskhub.accounts.permissions import approver_required, may_answer, may_see_task
from taskhub.tasks import services
from taskhub.tasks.errors import AlreadyAnswered, AnswerRejected, InputNoLongerOpen
from taskhub.tasks.inbox_listing import InboxListing, inbox_listing
from taskhub.tasks.input_cards import card_for, requests_user_may_see, response_from_post
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
        extra = [ir for ir in requests_user_may_see(request.user, included) if ir.pk not in shown]
        requests = sorted(requests + extra, key=lambda ir: (ir.created_at, ir.pk))
        cards = [card_for(ir, request.user, may_answer=True, next_url=_back_to(listing)) for ir in requests]
        return render(request, f"{INBOX_TEMPLATE}#card-list", _page_context(listing, cards))
    cards = [card_for(ir, request.user, may_answer=True, next_url=_back_to(listing)) for ir in requests]
    return render(request, INBOX_TEMPLATE, _page_context(listing, cards))


def _back_to(listing: InboxListing) -> str:
    """Where a plain POST's answer returns: this page of the inbox with its filters (the bare inbox needs no `next`)."""
    here = listing.query()
    return f"{reverse('tasks:inbox')}{here}" if here else ""


def _page_context(listing: InboxListing, cards) -> dict:
    here = listing.query()
    return {
        "cards": cards,
        "listing": listing,
        "form": listing.form,
        "more": listing.more,
        "filter_errors": list(listing.errors.values()),
        "cards_url": f"{reverse('tasks:inbox')}{here}{'&' if here else '?'}fragment=cards",
        "previous_href": listing.query(page=listing.page - 1) if listing.page > 1 else "",
        "next_href": listing.query(page=listing.page + 1) if listing.page < listing.pages else "",
        "show_disabled_href": listing.query(disabled="1", page=None),
        "clear_href": "",
    }


def _ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",")[:MAX_INCLUDED] if part.strip().isdigit()]


@approver_required
@require_POST
def answer(request, request_id):
    input_request = get_object_or_404(InputRequest.objects.select_related("task__server"), pk=request_id)
    if not may_answer(request.user, input_request):
        # As in the API: a request whose task the user may not see does not exist for them (a 403 would say it
        # does). Asked only on refusal, so an answer costs no extra query.
        if not may_see_task(request.user, input_request.task):
            raise Http404("No such input request.")
        raise PermissionDenied(f"You do not approve for the server {input_request.task.server.name!r}.")
    next_url = _safe_next(request)
    card = card_for(input_request, request.user, may_answer=True, next_url=next_url)
    try:
        response = response_from_post(card, request.POST)
        answered = services.answer_input(input_request=input_request, response=response, user=request.user)
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
        notice = f"{taken.answered_by} answered this first; your answer was not recorded."
        return _refused(request, card_for(input_request, request.user, may_answer=True, notice=notice), status=409)
    except InputNoLongerOpen as gone:
        input_request.refresh_from_db()
        notice = f"{gone} Nothing more to do here."
        return _refused(request, card_for(input_request, request.user, may_answer=True, notice=notice), status=409)

    if request.htmx:
        return render(request, CARD_TEMPLATE, {"card": card_for(answered, request.user, may_answer=True)})
    action = (answered.answer or {}).get("action", "answer")
    words = {"accept": "Accepted", "decline": "Declined", "cancel": "Cancelled"}.get(action, "Answered")
    messages.success(request, f"{words}: the answer to {answered.task.server.name} is recorded and being delivered.")
    return redirect(next_url or reverse("tasks:inbox"))


def _safe_next(request) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return ""


def _refused(request, card, *, status: int):
    """htmx: the card in place (200, so htmx swaps it); a plain POST: the inbox with this card in it."""
    if request.htmx:
        return render(request, CARD_TEMPLATE, {"card": card})
    target = urlsplit(_safe_next(request))
    filters = QueryDict(target.query) if target.path == reverse("tasks:inbox") else QueryDict()
    listing = inbox_listing(request.user, filters, page_size=CARDS_SHOWN)
    cards = [card_for(ir, request.user, may_answer=True, next_url=_back_to(listing)) for ir in listing.requests]
    cards = [card if other.pk == card.pk else other for other in cards]
    if all(other.pk != card.pk for other in cards):
        cards.insert(0, card)
    context = {**_page_context(listing, cards), "page_notice": card.notice or card.form_error}
    return render(request, INBOX_TEMPLATE, context, status=status)
