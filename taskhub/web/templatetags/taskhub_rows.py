"""`{% kept_row task selectable %}…{% endkept_row %}`: a row of the task list, rendered once and kept while nothing
it shows has changed; and `{% kept value %}…{% endkept %}`, a block kept while `value` reads the same: Home's trends,
keyed by all they show (trends.Trends.shown), and an input request's card (card_shown), whose CSRF token each render
puts in for its reader.

A row is some 25 template nodes, about 0.15 ms: the 50 rows of a list page were a third of its CPU (bench/pages.py),
and the page is fetched again on every live change of a task in it, when most of its rows read as before. A kept row
is keyed by all it shows: the task's row columns and facts (outcomes.ROW_FIELDS, ROW_FACTS and the outcome), its
times as they read now ("3 min ago"), the values named after the task (whether rows can be ticked), the language, the
URL prefix and URLconf, and the escaping. A row whose launch is retrying shows when the next try is due, a
countdown: it is never kept. The process keeps at most KEPT_ROWS rows, sections and cards together (a few MB), then
starts again.
"""

import datetime
import operator
import secrets
import uuid
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from decimal import Decimal

from django import template
from django.urls import get_resolver, get_script_prefix, get_urlconf
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import get_language

from taskhub.tasks.input_cards import INPUT_REQUEST_SHOWN, TASK_SHOWN, Card
from taskhub.tasks.outcomes import ROW_FACTS, ROW_FIELDS
from taskhub.tasks.schema_forms import SchemaForm
from taskhub.web.templatetags.taskhub_ui import relative_span

register = template.Library()

KEPT_ROWS = 2000
_ROW_PATHS = tuple(tuple(name.split("__")) for name in ROW_FIELDS)
# {(the block, the key): the row}, for every template's kept rows.
_kept: dict[tuple, str] = {}


def forget_kept_rows() -> None:
    _kept.clear()


class KeptRowNode(template.Node):
    def __init__(self, nodelist, task, vary_on):
        self.nodelist = nodelist
        self.task = task
        self.vary_on = vary_on

    def render(self, context):
        task = self.task.resolve(context)
        if task is None or task.launch_retrying:
            return self.nodelist.render(context)
        shown = (
            _shown(task),
            tuple(value.resolve(context) for value in self.vary_on),
            _as_it_reads(task.created_at),
            _as_it_reads(task.updated_at),
        )
        return _render_kept(self, shown, context)


# What a kept block holds where {% csrf_token %} put the reader's token: each render puts its own there. Random, so
# that no text from a server can hold it.
CSRF_STAND_IN = "csrf" + secrets.token_hex(16)
_NO_TOKEN = (None, "", "NOTPROVIDED")  # {% csrf_token %} renders nothing


class KeptNode(template.Node):
    """What `{% kept value %}` renders, kept while `value` (hashable: all the block shows) reads the same; None: not
    kept. A {% csrf_token %} in the block gives each render the reader's token."""

    def __init__(self, nodelist, value):
        self.nodelist = nodelist
        self.value = value

    def render(self, context):
        value = self.value.resolve(context)
        if value is None:
            return self.nodelist.render(context)
        return _render_kept(self, value, context)


def _render_kept(node, shown, context) -> str:
    """What `node` rendered under `shown` (all its block shows) for this language, URL prefix, URLconf and escaping;
    rendered and kept if nothing is. The reader's CSRF token goes where the kept block holds CSRF_STAND_IN."""
    token = context.get("csrf_token")
    has_token = token not in _NO_TOKEN
    key = (
        node,
        shown,
        has_token,
        get_language(),
        get_script_prefix(),
        get_resolver(get_urlconf()),
        context.autoescape,
    )
    kept = _kept.get(key)
    if kept is None:
        if has_token:
            with context.push(csrf_token=CSRF_STAND_IN):
                kept = node.nodelist.render(context)
        else:
            kept = node.nodelist.render(context)
        if len(_kept) >= KEPT_ROWS:
            _kept.clear()
        _kept[key] = kept
    return kept.replace(CSRF_STAND_IN, str(token)) if has_token else kept


def _as_it_reads(moment: datetime.datetime | None) -> tuple | None:
    """A time, and what reltime says of it now ("3 min ago"), but for the language (a kept block's key has it)."""
    return None if moment is None else (moment, relative_span(moment, timezone.now()))


class _NotKept(Exception):
    """A value shown_value cannot tell apart from another by what it holds."""


# Shown as they are; tested first, by type, before a call for each (a card's key is some 75 values).
_PLAIN = frozenset({str, int, bool, float, type(None)})
# {a type: what shows its values (_how_shown)}
_shown_by_type: dict[type, Callable] = {}


def shown_value(value):
    """`value` as a hashable value that differs wherever what a template shows of it can: text, numbers, times (with
    what reltime says of them now), lists and dicts, dataclasses field by field, a SchemaForm's fields. Raises
    _NotKept for anything else (a model, an object of unknown make): such a block is not kept."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    shown = _shown_by_type.get(kind)
    if shown is None:
        shown = _shown_by_type[kind] = _how_shown(kind)
    return shown(value)


def _how_shown(kind: type):
    """What shows a value of `kind` (a card's key is some 75 values, many of a few kinds: testing each value's kind
    in turn was about a sixth of the key's time)."""
    if kind is datetime.datetime:
        return _as_it_reads
    if issubclass(kind, Promise):
        return str
    if issubclass(kind, str):  # safe text renders otherwise than plain text
        return lambda value: (kind.__name__, str(value))
    if issubclass(kind, list | tuple):
        return _shown_values
    if issubclass(kind, dict):
        return lambda value: tuple((shown_value(name), shown_value(each)) for name, each in value.items())
    if is_dataclass(kind):
        getter = _getter(tuple(each.name for each in fields(kind)))
        return lambda value: (kind.__name__, *_shown_values(getter(value)))
    if issubclass(kind, SchemaForm):
        return _shown_form
    if issubclass(kind, uuid.UUID | datetime.date | Decimal):
        return _as_is
    return _not_kept


def _shown_form(form: SchemaForm) -> tuple:
    try:
        return "SchemaForm", shown_value(form.use), form.shown
    except (TypeError, ValueError, RecursionError) as error:  # a schema that is no JSON
        raise _NotKept(error) from None


def _as_is(value):
    return value


def _not_kept(value):
    raise _NotKept(type(value))


def _shown_values(values) -> tuple:
    return tuple(each if type(each) in _PLAIN else shown_value(each) for each in values)


def _getter(names: tuple[str, ...]):
    """What reads `names` of an object as a tuple (attrgetter of one name gives the value alone)."""
    getter = operator.attrgetter(*names)
    return getter if len(names) > 1 else lambda value: (getter(value),)


# A card's own fields; its request is keyed by INPUT_REQUEST_SHOWN instead (a model: shown_value would not keep it).
_CARD_FIELDS = tuple(each.name for each in fields(Card) if each.name != "input_request")
_card_fields = _getter(_CARD_FIELDS)
_request_shown = _getter(INPUT_REQUEST_SHOWN)
_task_shown = _getter(TASK_SHOWN)


def card_shown(card):
    """All an input request's card (templates/tasks/input_request_card.html) shows, as one hashable value: the card's
    fields, the request's and the task's that the template reads (input_cards.INPUT_REQUEST_SHOWN, TASK_SHOWN) and
    the task's server's name. None when something in it cannot be told apart by value (the card is not kept)."""
    request = card.input_request
    task = request.task
    try:
        return (
            _shown_values(_request_shown(request)),
            _shown_values(_task_shown(task)),
            task.server.name,
            _shown_values(_card_fields(card)),
        )
    except _NotKept:
        return None


def _shown(task) -> tuple:
    """What a row shows of the task: its id, columns, facts and outcome."""
    values = [task.pk, getattr(task, "outcome", None)]
    # result_is_error is the result's JSON isError, which may be anything; the row tells only whether it is true.
    values += [
        getattr(task, fact, None) is True if fact == "result_is_error" else getattr(task, fact, None)
        for fact in ROW_FACTS
    ]
    for path in _ROW_PATHS:
        value = task
        for name in path:
            value = getattr(value, name) if value is not None else None
        values.append(value)
    return tuple(values)


@register.tag
def kept_row(parser, token):
    bits = token.split_contents()
    if len(bits) < 2:
        raise template.TemplateSyntaxError("kept_row needs the task: {% kept_row task [value …] %}")
    nodelist = parser.parse(("endkept_row",))
    parser.delete_first_token()
    return KeptRowNode(nodelist, parser.compile_filter(bits[1]), [parser.compile_filter(bit) for bit in bits[2:]])


@register.tag
def kept(parser, token):
    bits = token.split_contents()
    if len(bits) != 2:
        raise template.TemplateSyntaxError("kept needs one value, all the block shows: {% kept value %}")
    nodelist = parser.parse(("endkept",))
    parser.delete_first_token()
    return KeptNode(nodelist, parser.compile_filter(bits[1]))


register.filter("card_shown", card_shown)
