"""The inbox's live fragment (FragmentKind.INBOX): sent for a changed task on a server the user approves for.

One signal, templates/tasks/inbox.html#live-signal, pushed to every page of the approver (the inbox, a task's
page, any other), so it targets what every page has and changes nothing by itself:

- It holds the cards of the task's requests that are no longer open (answered, delivered, withdrawn, the task
  ended); static/taskhub/live.js puts each in place of the card with the same id wherever a page shows it (inbox,
  task detail). Open cards are never pushed: that would wipe what someone is typing into them.
- When the task has open requests it says so, and an open inbox re-fetches its list (static/taskhub/inbox.js,
  throttled), which adds cards that are new.
"""

from django.template.loader import render_to_string

from taskhub.tasks.input_cards import card_for
from taskhub.tasks.models import InputRequestState, may_have_input_requests

SIGNAL_TEMPLATE = "tasks/inbox.html#live-signal"


def inbox_fragment(task, user) -> str:
    if not may_have_input_requests(task):  # it has asked nothing
        return ""
    requests = list(task.input_requests.select_related("answered_by").order_by("created_at", "pk"))
    closed_cards = []
    has_open_requests = False
    for input_request in requests:
        input_request.task = task
        if input_request.state == InputRequestState.OPEN and not task.is_terminal:
            has_open_requests = True
            continue
        closed_cards.append(card_for(input_request, user, may_answer=True))
    if not closed_cards and not has_open_requests:
        return ""
    return render_to_string(SIGNAL_TEMPLATE, {"closed_cards": closed_cards, "has_open_requests": has_open_requests})
