"""What an inbox card shows beside its question (issue 34, item 10): what the task was launched with, and what happened
to it before the question, so that the person answering need not leave the inbox to find out. Read for a whole page
of cards at once: one query for the audit events of all their tasks (the latest few of each, by the (task, time)
index), whatever the number of cards.

The arguments are the launcher's (or an agent's), the events taskhub's own words (audit.events); a status message from
the server is shown as the server's. Everything is autoescaped by the template and capped here.
"""

import datetime
import functools
from dataclasses import dataclass, field

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from taskhub.audit.models import AuditEvent, shown_actor, shown_description
from taskhub.tasks.capped_text import cap, pretty_json
from taskhub.tasks.input_cards import Card

BEFORE_SHOWN = 6
# Events a little after the question's row was written still belong to its asking (one transaction, two clocks).
ASKED_SLACK = datetime.timedelta(seconds=2)
ARGUMENTS_CAP = 3000
STATUS_CAP = 300


@dataclass
class Earlier:
    time: datetime.datetime
    actor: str
    words: str


@dataclass
class CardContext:
    arguments: str  # pretty JSON, capped ("" for none)
    arguments_cut: bool
    status_message: str  # the server's latest (or taskhub's own, say `status_is_taskhubs`)
    status_is_taskhubs: bool
    before: list[Earlier] = field(default_factory=list)
    earlier: int = 0  # events before those shown, not shown


def with_context(cards: list[Card]) -> list[Card]:
    """Sets `card.context` on each open card (an answered one needs none); returns the cards."""
    open_cards = [card for card in cards if card.state == "open"]
    if not open_cards:
        return cards
    task_ids = {card.input_request.task_id for card in open_cards}
    until = max(card.input_request.created_at for card in open_cards) + ASKED_SLACK
    # Rows, not models: building 50 tasks' events as models was a tenth of the inbox's CPU (bench/pages.py).
    ranked = (
        AuditEvent.objects.filter(task_id__in=task_ids, time__lte=until)
        .annotate(rank=Window(RowNumber(), partition_by=[F("task_id")], order_by=[F("time").desc(), F("pk").desc()]))
        .filter(rank__lte=BEFORE_SHOWN * 2)
        .values_list("task_id", "time", "actor_label", "action")
    )
    events: dict = {}
    # The few actions and actors translated once each, not once per event: a translation is a lookup of the active
    # language in a context-local: 3.2 -> 2.4 ms of this function for 50 cards and their 150 events.
    words, actors = functools.cache(shown_description), functools.cache(shown_actor)
    for task_id, time, actor_label, action in ranked:
        events.setdefault(task_id, []).append(Earlier(time, actors(actor_label), words(action)))
    for card in open_cards:
        task, asked = card.input_request.task, card.input_request.created_at + ASKED_SLACK
        before = sorted((event for event in events.get(task.pk, []) if event.time <= asked), key=lambda e: e.time)
        arguments = pretty_json(task.arguments, ARGUMENTS_CAP) if task.arguments else None
        card.context = CardContext(
            arguments=arguments.text if arguments else "",
            arguments_cut=bool(arguments and arguments.truncated),
            status_message=cap(task.status_message, STATUS_CAP).text,
            status_is_taskhubs=task.status_message_is_taskhubs,
            before=before[-BEFORE_SHOWN:],
            earlier=max(0, len(before) - BEFORE_SHOWN),
        )
    return cards
