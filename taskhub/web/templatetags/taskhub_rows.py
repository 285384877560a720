"""`{% kept_row task selectable %}…{% endkept_row %}`: a row of the task list, rendered once and kept while nothing
it shows has changed; and `{% kept value %}…{% endkept %}`, a block kept while `value` reads the same (Home's trends,
keyed by all they show: trends.Trends.shown).

A row is some 25 template nodes, about 0.15 ms: the 50 rows of a list page were a third of its CPU (bench/pages.py),
and the page is fetched again on every live change of a task in it, when most of its rows read as before. A kept row
is keyed by all it shows: the task's row columns and facts (outcomes.ROW_FIELDS, ROW_FACTS and the outcome), its
times as they read now ("3 min ago"), the values named after the task (whether rows can be ticked), the language, the
URL prefix and URLconf, and the escaping. A row whose launch is retrying shows when the next try is due, a
countdown: it is never kept. The process keeps at most KEPT_ROWS rows, then starts again.
"""

from django import template
from django.urls import get_resolver, get_script_prefix, get_urlconf
from django.utils.translation import get_language

from taskhub.tasks.outcomes import ROW_FACTS, ROW_FIELDS
from taskhub.web.templatetags.taskhub_ui import reltime

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
        key = (
            self,
            _shown(task),
            tuple(value.resolve(context) for value in self.vary_on),
            reltime(task.created_at),
            reltime(task.updated_at),
            get_language(),
            get_script_prefix(),
            get_resolver(get_urlconf()),
            context.autoescape,
        )
        row = _kept.get(key)
        if row is None:
            row = self.nodelist.render(context)
            if len(_kept) >= KEPT_ROWS:
                _kept.clear()
            _kept[key] = row
        return row


class KeptNode(template.Node):
    """What `{% kept value %}` renders, kept while `value` (hashable: all the block shows) reads the same."""

    def __init__(self, nodelist, value):
        self.nodelist = nodelist
        self.value = value

    def render(self, context):
        key = (
            self,
            self.value.resolve(context),
            get_language(),
            get_script_prefix(),
            get_resolver(get_urlconf()),
            context.autoescape,
        )
        kept = _kept.get(key)
        if kept is None:
            kept = self.nodelist.render(context)
            if len(_kept) >= KEPT_ROWS:
                _kept.clear()
            _kept[key] = kept
        return kept


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
