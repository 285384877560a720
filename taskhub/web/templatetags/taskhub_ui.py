"""Small pieces every page shows the same way: status pills, times, short ids."""

import datetime
import functools
from html import escape

from django import template
from django.utils import timezone
from django.utils.formats import localize
from django.utils.html import conditional_escape, format_html, json_script
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince
from django.utils.translation import get_language, gettext_noop, pgettext_lazy
from django.utils.translation import gettext as _

from taskhub.tasks.durations import duration_text
from taskhub.tasks.models import NOT_APPROVED, TaskStatus
from taskhub.tasks.outcomes import OUTCOME_WORDS, Outcome
from taskhub.tasks.trends import lay_out

register = template.Library()

SERVER_STATUSES = frozenset({"working", "input_required", "completed", "failed", "cancelled"})
STATUS_WORDS = {**{status.value: status.label for status in TaskStatus}}
STATUS_WORDS["input_required"] = pgettext_lazy("task status", "needs input")


@register.simple_tag
def status_pill(status: str) -> SafeString:
    """The one status colour of UI.md: filled for the server's five, outlined for taskhub's own states."""
    return _status_pill(get_language(), status)


@functools.lru_cache(maxsize=256)
def _status_pill(language: str | None, status: str) -> SafeString:
    kind = f"status-{status}" if status in SERVER_STATUSES else "local"
    return format_html(
        '<span class="pill {}" data-status="{}">{}</span>', kind, status, STATUS_WORDS.get(status, status)
    )


@register.simple_tag
def js_words() -> str:
    """The words static/taskhub/*.js writes into pages, in the person's language (a JSON block: no script runs)."""
    words = {
        "notify_me": _("Notify me"),
        "notify_on": _("Notifications on"),
        "notify_me_title": _("Get a desktop notification when a request waits for you."),
        "notify_on_title": _("A desktop notification tells you when a request waits for you. Click to stop them."),
        "tasks_new_one": _("%s new task"),
        "tasks_new_many": _("%s new tasks"),
        "tasks_changed_one": _("%s task changed"),
        "tasks_changed_many": _("%s tasks changed"),
        "tasks_updated": _("Task list updated: %s."),
        "list_separator": _(", "),
        "exact_times": _("Exact times"),
        "relative_times": _("Relative times"),
        "inbox_new_one": _("A new request arrived."),
        "task_ended": _("The task ended: %s."),
        "requests_open": _("%s open"),
        "inbox_new_many": _("%s new requests arrived."),
        "home_updated": _("Home updated."),
        "copied": _("copied"),
    }
    return json_script(words, "taskhub-words")


@register.filter
def reltime(value: datetime.datetime | None) -> SafeString:
    """`<time>` saying "3 min ago" (or "in 3 min"), with the exact UTC time on hover."""
    if not value:
        return format_html('<span class="muted">{}</span>', "—")
    now = timezone.now()
    exact = value.astimezone(datetime.UTC)
    span = relative_span(value, now)
    if span[0] == MONTHS:
        words = calendar_relative_words(value, now)
    else:
        words = _relative_words(get_language(), span[0], ago=span[1])
    # isoformat(" ", "seconds") is strftime's "%Y-%m-%d %H:%M:%S" and "+00:00", at a third of its cost (100 a list).
    return mark_safe(
        f'<time datetime="{exact.isoformat()}" title="{exact.isoformat(" ", "seconds")[:19]} UTC">{words}</time>'
    )


MONTHS = "months"
AHEAD_ROUNDING = datetime.timedelta(seconds=59)


def relative_span(value: datetime.datetime, now: datetime.datetime) -> tuple:
    """All reltime's words say of `value` at `now` in a language: (whole minutes, ago) under four weeks, (MONTHS,
    whole calendar months, ago) from then on. Cheaper than the words: a kept row or card is keyed by it."""
    seconds = (now - value).total_seconds()
    # Under a minute is "just now" both ways: timesince counts whole minutes, and would say "0 minutes".
    if -60 < seconds < 60:
        return 0, True
    if seconds >= 0:
        start, end, ago = value, now, True
    else:
        # Counted down as a countdown is, to the next whole minute: "in 7 days" made a second ago is not "in 6 days"
        # (timesince floors every unit).
        start, end, ago = now, value + AHEAD_ROUNDING, False
    minutes = _whole_minutes(end - start)
    if minutes < FOUR_WEEKS_MINUTES:
        return minutes, ago
    return MONTHS, _whole_months(start, end), ago


# Under four weeks, timesince's words (depth 1) depend only on the whole minutes between the two times: months and
# years, which depend on the calendar, cannot occur. So they are made once per language and number of minutes: a list
# page asked timesince (its lazy translations) and format_html twice a row, a fifth of the row's time.
FOUR_WEEKS_MINUTES = 4 * 7 * 24 * 60


def _whole_minutes(delta: datetime.timedelta) -> int:
    return int(delta.total_seconds() // 60)


@functools.lru_cache(maxsize=4096)
def _relative_words(language: str | None, minutes: int, *, ago: bool) -> str:
    """The escaped words for `minutes` ago (or ahead), "" from four weeks on; `language` is the active one (the key)."""
    if minutes >= FOUR_WEEKS_MINUTES:
        return ""
    if minutes == 0:
        return escape(_("just now"))
    start = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
    span = timesince(start, start + datetime.timedelta(minutes=minutes), depth=1).replace("\xa0", " ")
    return escape((_("%(time)s ago") if ago else _("in %(time)s")) % {"time": span})


def calendar_relative_words(value: datetime.datetime, now: datetime.datetime) -> str:
    """Four weeks or more: the calendar's months and years, as timesince counts them; the words made once per
    language and number of months (an inbox of old requests asked timesince for every time on it)."""
    ago = value <= now
    start, end = (value, now) if ago else (now, value + AHEAD_ROUNDING)
    key = (get_language(), _whole_months(start, end), ago)
    words = _calendar_words.get(key)
    if words is None:
        span = timesince(start, end, depth=1)
        words = escape(((_("%(time)s ago") if ago else _("in %(time)s")) % {"time": span}).replace("\xa0", " "))
        if len(_calendar_words) >= CALENDAR_WORDS_KEPT:
            _calendar_words.clear()
        _calendar_words[key] = words
    return words


CALENDAR_WORDS_KEPT = 4096
_calendar_words: dict[tuple[str | None, int, bool], str] = {}


def _whole_months(start: datetime.datetime, end: datetime.datetime) -> int:
    """The whole calendar months from start to end, counted as timesince counts them. From four weeks on, its words
    (depth 1) depend on nothing else: the years or months, or "4 weeks" under one month."""
    end = end.astimezone(start.tzinfo)
    months = (end.year - start.year) * 12 + (end.month - start.month)
    if start.day > end.day or (start.day == end.day and start.time() > end.time()):
        months -= 1
    return months


@register.filter
def svg_number(value) -> str:
    """A coordinate or length in an SVG attribute: two decimals, a dot, no grouping. floatformat:'2u' says as much
    through Decimal and the locale machinery at ten times the cost, and Home's charts have some 450 of them."""
    return f"{float(value):.2f}"


@register.simple_tag
def trend_svg(chart) -> SafeString:
    """A chart of Home's trends (taskhub/tasks/trends.py) as its SVG: per bucket a <g> with its words as the title,
    its started bar and its ended bars stacked by outcome. Some 450 coordinates and 30 titles: as template nodes,
    2.4 ms of Home's trends drawn afresh, written here 0.4 (in-process, bench/pages.py's data)."""
    lay_out(chart)
    bar = svg_number(chart.bar)
    message = gettext_noop("%(label)s: %(started)s started, %(ended)s ended")
    words = _(message)
    drawn = [
        format_html(
            '<svg class="trend-svg" viewBox="0 0 {} {}" preserveAspectRatio="none" aria-hidden="true" '
            'focusable="false">',
            f"{chart.width:.1f}",
            chart.height,
        )
    ]
    for bucket in chart.buckets:
        # As {% blocktranslate %} puts values in: each rendered (localised) and escaped, the message as translated,
        # and the message as written where its translation names other values.
        values = {
            "label": conditional_escape(bucket.label),
            "started": conditional_escape(localize(bucket.started)),
            "ended": conditional_escape(localize(bucket.ended_total)),
        }
        try:
            said = words % values
        except (KeyError, ValueError):
            said = message % values
        drawn.append(
            f'<g><title>{said}</title><rect class="bar-started" x="{svg_number(bucket.x)}" '
            f'y="{svg_number(bucket.started_y)}" width="{bar}" height="{svg_number(bucket.started_height)}"></rect>'
        )
        ended_x = svg_number(bucket.ended_x)
        drawn.extend(
            f'<rect class="bar-{segment.outcome}" x="{ended_x}" y="{svg_number(segment.y)}" width="{bar}" '
            f'height="{svg_number(segment.height)}"></rect>'
            for segment in bucket.segments
        )
        drawn.append("</g>\n")
    drawn.append("</svg>")
    return mark_safe("".join(drawn))  # every value in it escaped, a number or an outcome's name


@register.simple_tag
def trend_table_rows(chart) -> SafeString:
    """A chart's buckets as the rows of its table (what a screen reader reads in place of the bars): the bucket, its
    started, its ended per outcome. Some 220 numbers, each localised as {{ count }} would: once per value shown (most
    are the same few), where the template's nodes took 1.7 ms of Home's trends drawn afresh."""
    localised: dict[int, str] = {}

    def shown(count: int) -> str:
        text = localised.get(count)
        if text is None:
            text = localised[count] = conditional_escape(localize(count))
        return text

    return mark_safe(  # the labels escaped, the counts localised and escaped
        "".join(
            f'<tr><th scope="row">{conditional_escape(bucket.label)}</th><td>{shown(bucket.started)}</td>'
            + "".join(f"<td>{shown(count)}</td>" for count in bucket.ended_in_order)
            + "</tr>\n"
            for bucket in chart.buckets
        )
    )


@register.filter
def short_id(value, length: int = 8) -> str:
    """The first characters of an id, the whole id on hover, and a copy button (static/taskhub/ui.js)."""
    text = str(value or "")
    if not text:
        return ""
    shown = text if len(text) <= length + 1 else f"{text[:length]}…"
    return format_html(
        '<span class="short-id"><code title="{}">{}</code>'
        '<button type="button" class="copy" data-copy="{}" aria-label="{}">{}</button></span>',
        text,
        shown,
        text,
        _("Copy %(id)s") % {"id": text},
        _("copy"),
    )


@register.simple_tag
def outcome_badge(task) -> str:
    """How a finished task ended, in a colour and the words of outcomes.OUTCOMES (the filter's and Home's): "completed
    with error", "cancelled by dana", "failed (-32603)", "declined at the gate"… `task` carries the list's annotations
    (outcomes.with_row_facts); a running task shows a dash."""
    outcome = getattr(task, "outcome", "") or ""
    if not outcome:
        return format_html('<span class="muted">{}</span>', "—")
    words = OUTCOME_WORDS.get(outcome, outcome)
    detail = ""
    if outcome == Outcome.CANCELLED:
        who = task.cancel_requested_by.get_username() if task.cancel_requested_by_id else ""
        detail = _("by %(person)s") % {"person": who} if who else _("by the server")
    elif outcome == Outcome.FAILED and getattr(task, "error_code", None):
        detail = f"({task.error_code})"
    if outcome == Outcome.DECLINED and getattr(task, "error_kind", None) == NOT_APPROVED:
        detail = _("at the gate")  # not approved: ended at the gate before the call: tools/call was never sent
    return format_html(
        '<span class="outcome outcome-{}" data-outcome="{}">{}</span>{}',
        outcome,
        outcome,
        words,
        format_html(' <span class="outcome-detail">{}</span>', detail) if detail else "",
    )


@register.filter
def task_duration(task) -> str:
    """From launch to the end (finished_at); "running" for a task that runs (its start is in the next column, and a
    live row is rendered once for many pages, so it holds nothing that ages)."""
    if task.finished_at and task.created_at:
        return duration_text(max(0.0, (task.finished_at - task.created_at).total_seconds()))
    return "" if task.status in TERMINAL_STATUS_VALUES else _("running")


TERMINAL_STATUS_VALUES = frozenset({"completed", "failed", "cancelled", "expired", "lost", "launch_unknown"})
