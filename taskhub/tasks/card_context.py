"""What an inbox card shows beside its question (issue 34, item 10): what the task was launched with, and what happened
to it before the question, so that the person answering need not leave the inbox to find out. Read for a whole page
of cards at once: one statement for the audit events of all their questions (the latest few before each, by the
(task, time) index), whatever the number of cards.

What happened before a question asked a minute ago or more is kept in the process (the audit trail only grows, and no
event is written a minute after its time): the inbox is fetched again on every change of a card on it, and its
questions are mostly older. Kept per language, at most KEPT_BEFORE questions.

The arguments are the launcher's (or an agent's), the events taskhub's own words (audit.events); a status message from
the server is shown as the server's. Everything is autoescaped by the template and capped here.
"""

import datetime
import functools
from dataclasses import dataclass, field

from django.db import connection
from django.utils import timezone
from django.utils.translation import get_language

from taskhub.audit.models import AuditEvent, shown_actor, shown_description
from taskhub.tasks.capped_text import cap, pretty_json
from taskhub.tasks.input_cards import Card

BEFORE_SHOWN = 6
# Events a little after the question's row was written still belong to its asking (one transaction, two clocks).
ASKED_SLACK = datetime.timedelta(seconds=2)
ARGUMENTS_CAP = 3000
STATUS_CAP = 300
KEPT_BEFORE = 5000
# A question asked this long ago has all its events before it written: they are kept.
SETTLED_AFTER = datetime.timedelta(minutes=1)


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
    earlier: bool = False  # there were events before those shown


# {(task id, when asked with its slack, language): (the events shown before the question, whether there were more)}
_kept_before: dict[tuple, tuple[list[Earlier], bool]] = {}


def with_context(cards: list[Card]) -> list[Card]:
    """Sets `card.context` on each open card (an answered one needs none); returns the cards."""
    open_cards = [card for card in cards if card.state == "open"]
    if not open_cards:
        return cards
    language, settled = get_language(), timezone.now() - SETTLED_AFTER
    asked = {card.pk: card.input_request.created_at + ASKED_SLACK for card in open_cards}
    kept_as = {card.pk: (card.input_request.task_id, asked[card.pk], language) for card in open_cards}
    before = {pk: _kept_before.get(key) for pk, key in kept_as.items()}
    unread = [card for card in open_cards if before[card.pk] is None]
    if unread:
        read = _read_before(unread, asked)
        if len(_kept_before) + len(unread) > KEPT_BEFORE:
            _kept_before.clear()
        for card in unread:
            before[card.pk] = read[card.pk]
            if asked[card.pk] < settled:
                _kept_before[kept_as[card.pk]] = read[card.pk]
    for card in open_cards:
        task = card.input_request.task
        arguments = pretty_json(task.arguments, ARGUMENTS_CAP) if task.arguments else None
        shown, earlier = before[card.pk]
        card.context = CardContext(
            arguments=arguments.text if arguments else "",
            arguments_cut=bool(arguments and arguments.truncated),
            status_message=cap(task.status_message, STATUS_CAP).text,
            status_is_taskhubs=task.status_message_is_taskhubs,
            before=shown,
            earlier=earlier,
        )
    return cards


def _read_before(cards: list[Card], asked: dict) -> dict[int, tuple[list[Earlier], bool]]:
    """{a card's request id: the latest BEFORE_SHOWN events of its task up to when it was asked, oldest first, and
    whether there were more}, in one statement: each question's own few through the (task, time) index, as rows
    (building a page's events as models was a tenth of the inbox's CPU, bench/pages.py)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _before_sql(),
            [[card.pk for card in cards], [card.input_request.task_id for card in cards], [asked[c.pk] for c in cards]],
        )
        rows = cursor.fetchall()
    # The few actions and actors translated once each, not once per event: a translation is a lookup of the active
    # language in a context-local: 3.2 -> 2.4 ms of this function for 50 cards and their 150 events.
    words, actors = functools.cache(shown_description), functools.cache(shown_actor)
    events: dict[int, list[Earlier]] = {card.pk: [] for card in cards}
    for request_id, time, actor_label, action in rows:
        events[request_id].append(Earlier(time, actors(actor_label), words(action)))
    return {pk: (shown[-BEFORE_SHOWN:], len(shown) > BEFORE_SHOWN) for pk, shown in events.items()}


@functools.cache
def _before_sql() -> str:
    table = AuditEvent._meta.db_table
    return f"""
        SELECT asked.request_id, event.time, event.actor_label, event.action
        FROM unnest(%s::bigint[], %s::uuid[], %s::timestamptz[]) AS asked(request_id, task_id, until)
        CROSS JOIN LATERAL (
            SELECT time, id, actor_label, action FROM "{table}"
            WHERE task_id = asked.task_id AND time <= asked.until
            ORDER BY time DESC, id DESC LIMIT {BEFORE_SHOWN + 1}
        ) AS event
        ORDER BY asked.request_id, event.time, event.id
    """
