"""The inbox's live fragments (FragmentKind.INBOX): sent for a changed task on a server the user approves for.

- Cards of the task's requests that are no longer open (answered, delivered, withdrawn, the task ended)
  replace the card with the same id wherever it is shown (inbox, task detail), out of band. Open cards
  are never pushed: that would wipe what someone is typing into them.
- When the task has open requests, a marker (#inbox-live) with a new sequence number tells an open inbox
  to re-fetch its list (static/taskhub/inbox.js, throttled), which adds cards that are new.
"""

import uuid

from django.template.loader import render_to_string
from django.utils.html import format_html

from taskhub.tasks.input_cards import card_for
from taskhub.tasks.models import InputRequestState

CARD_TEMPLATE = "tasks/input_request_card.html"


def inbox_fragment(task, user) -> str:
    requests = list(task.input_requests.select_related("answered_by").order_by("created_at", "pk"))
    parts = []
    for input_request in requests:
        input_request.task = task
        if input_request.state == InputRequestState.OPEN and not task.is_terminal:
            continue
        card = card_for(input_request, user, may_answer=True)
        parts.append(render_to_string(CARD_TEMPLATE, {"card": card, "oob": True}))
    if any(ir.state == InputRequestState.OPEN for ir in requests):
        parts.append(
            format_html('<div id="inbox-live" hx-swap-oob="true" data-seq="{}" hidden></div>', uuid.uuid4().hex)
        )
    return "".join(parts)
