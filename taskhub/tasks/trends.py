"""Home's trends: how the work went over time, for the tasks a person may see (queries.tasks_visible_to).

- Tasks started and ended per hour over the last 24 hours and per day over the last 7, the ended ones by outcome
  (outcomes.outcome_counts_per, the one definition the list's ?outcome= and Home's counts use).
- Time to answer an input request (asked to answered by a person), p50 and p95 per server, over 24 hours.
- The slowest tools (per tool and server) by p95 of their tasks' duration (started to ended), over 24 hours.

GROUP BY queries over a window read through an index: task_created (created_at) for the started, task_finished
(partial, finished_at) for the ended and the durations, input_request_state_created (state, created_at) for the
answers. The charts' hours are trend_hours.hour_counts': those that are over kept, the current ones counted.
Percentiles do not add up across hours, so those two are counted whole, over a day (~12,000 tasks at
bench/pages.py's rate). Every chart carries the links to the task lists that show it.
"""

import datetime
from dataclasses import dataclass, field

from django.db.models import Aggregate, Count, F, FloatField, Func
from django.utils import dateformat, timezone
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from taskhub.accounts import permissions
from taskhub.database.compiled import compiled_rows
from taskhub.tasks.durations import duration_text
from taskhub.tasks.list_links import tasks_href
from taskhub.tasks.models import InputRequest, InputRequestState
from taskhub.tasks.outcomes import OUTCOMES, Outcome
from taskhub.tasks.queries import tasks_visible_to
from taskhub.tasks.trend_hours import DAY, HOUR, floor_to, hour_counts
from taskhub.tasks.visible_reads import visible_rows

WEEK_DAYS = 7
SLOWEST_SHOWN = 5
SERVERS_SHOWN = 8
# The outcomes a chart stacks: every one a task that ended can have (launch_unknown never ends).
ENDED_OUTCOMES = tuple((value, words) for value, words, _ in OUTCOMES if value != Outcome.UNKNOWN)
# The SVG's drawing box; the page scales it to the card's width.
CHART_HEIGHT = 120
BAR_ROW_HEIGHT = 22
BAR_WIDTH = 300


class Seconds(Func):
    """EXTRACT(EPOCH FROM (end - start)): the seconds between two timestamps."""

    template = "EXTRACT(EPOCH FROM (%(expressions)s))"
    arg_joiner = " - "
    output_field = FloatField()


class Median(Aggregate):
    function = "percentile_cont"
    template = "percentile_cont(0.5) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


class P95(Aggregate):
    function = "percentile_cont"
    template = "percentile_cont(0.95) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


@dataclass
class Segment:
    outcome: str
    words: str
    count: int
    y: float = 0.0
    height: float = 0.0


@dataclass
class Bucket:
    start: datetime.datetime
    label: str  # "14:00" or "Dec 3"
    started: int = 0
    ended: dict[str, int] = field(default_factory=dict)
    href: str = ""  # the list's tasks started in it (days only: the list filters by date)
    x: float = 0.0
    ended_x: float = 0.0
    started_y: float = 0.0
    started_height: float = 0.0
    segments: list[Segment] = field(default_factory=list)

    @property
    def ended_total(self) -> int:
        return sum(self.ended.values())

    @property
    def ended_in_order(self) -> list[int]:
        return [self.ended.get(value, 0) for value, _ in ENDED_OUTCOMES]


@dataclass
class Legend:
    outcome: str
    words: str
    total: int
    href: str


@dataclass
class Chart:
    key: str  # "24h" or "7d"
    title: str
    buckets: list[Bucket]
    legend: list[Legend]
    started_total: int
    started_href: str
    slot: float = 0.0  # width of a bucket in the SVG's box
    bar: float = 0.0
    width: float = 0.0
    height: int = CHART_HEIGHT
    peak: int = 0
    laid_out: bool = False

    @property
    def ended_total(self) -> int:
        return sum(item.total for item in self.legend)

    @property
    def shown(self) -> tuple:
        return (
            self.key,
            self.title,
            self.started_total,
            self.started_href,
            tuple((bucket.label, bucket.started, tuple(bucket.ended.items()), bucket.href) for bucket in self.buckets),
            tuple((item.outcome, item.total, item.href) for item in self.legend),
        )


@dataclass
class DurationRow:
    label: str
    server: str
    count: int
    p50: float | None
    p95: float | None
    href: str
    y: float = 0.0
    p50_width: float = 0.0
    p95_width: float = 0.0

    @property
    def p50_text(self) -> str:
        return duration_text(self.p50)

    @property
    def p95_text(self) -> str:
        return duration_text(self.p95)

    @property
    def shown(self) -> tuple:
        return (self.label, self.server, self.count, self.p50, self.p95, self.href)


@dataclass
class Trends:
    per_hour: Chart
    per_day: Chart
    answer_times: list[DurationRow]
    slowest_tools: list[DurationRow]
    bar_width: int = BAR_WIDTH
    row_height: int = BAR_ROW_HEIGHT

    @property
    def charts(self) -> list[Chart]:
        return [self.per_hour, self.per_day]

    @property
    def shown(self) -> tuple:
        """What the trends' section shows, as one hashable value, Home keeps the section's HTML under ({% kept %},
        taskhub_rows): the charts' and rows' counts, words and links. Where each bar and row stands and how long it
        is comes from these (lay_out, _lay_out_rows); the words that are the same for all are the language's."""
        return (
            tuple(chart.shown for chart in self.charts),
            tuple(row.shown for row in self.answer_times),
            tuple(row.shown for row in self.slowest_tools),
        )

    @property
    def ended_outcomes(self) -> tuple:
        return ENDED_OUTCOMES

    @property
    def answer_times_height(self) -> int:
        return max(1, len(self.answer_times)) * BAR_ROW_HEIGHT

    @property
    def slowest_tools_height(self) -> int:
        return max(1, len(self.slowest_tools)) * BAR_ROW_HEIGHT


def _chart(hours: dict, *, unit: str, count: int, now: datetime.datetime) -> Chart:
    step = HOUR if unit == "hour" else DAY
    first = floor_to(now, unit) - step * (count - 1)
    per_bucket: dict[datetime.datetime, list] = {}
    for hour, counts in hours.items():  # whole hours in UTC
        if hour >= first:
            per_bucket.setdefault(hour if unit == "hour" else hour.replace(hour=0), []).append(counts)
    buckets = []
    for n in range(count):
        start = first + step * n
        inside = per_bucket.get(start, [])
        day = start.date().isoformat()
        buckets.append(
            Bucket(
                start=start,
                label=start.strftime("%H:00")
                if unit == "hour"
                else dateformat.format(start, pgettext("a day on a chart", "M j")),
                started=sum(counts["started"] for counts in inside),
                ended={value: sum(counts["ended"].get(value, 0) for counts in inside) for value, _ in ENDED_OUTCOMES},
                href=tasks_href(since=day, until=day) if unit == "day" else "",
            )
        )
    window = "24h" if unit == "hour" else "7d"
    legend = [
        Legend(
            outcome=value,
            words=words,
            total=sum(bucket.ended[value] for bucket in buckets),
            href=tasks_href(outcome=value, ended=window),
        )
        for value, words in ENDED_OUTCOMES
    ]
    chart = Chart(
        key=window,
        title=_("Last 24 hours, per hour") if unit == "hour" else _("Last 7 days, per day"),
        buckets=buckets,
        legend=legend,
        started_total=sum(bucket.started for bucket in buckets),
        # The list filters by start date: from the window's first day.
        started_href=tasks_href(since=first.date().isoformat()),
    )
    return chart


def lay_out(chart: Chart) -> None:
    """Each bucket two bars side by side: started (one), ended (stacked by outcome), scaled to the tallest. Done when
    the chart is drawn (taskhub_ui.trend_svg), once: a section kept rendered needs none of it."""
    if chart.laid_out:
        return
    chart.laid_out = True
    chart.slot = 12.0 if len(chart.buckets) > 12 else 40.0
    chart.bar = chart.slot * 0.4
    chart.width = chart.slot * len(chart.buckets)
    chart.peak = max([1, *(max(bucket.started, bucket.ended_total) for bucket in chart.buckets)])
    scale = (CHART_HEIGHT - 2) / chart.peak
    for n, bucket in enumerate(chart.buckets):
        bucket.x = n * chart.slot + chart.slot * 0.1
        bucket.ended_x = bucket.x + chart.bar
        bucket.started_height = bucket.started * scale
        bucket.started_y = CHART_HEIGHT - bucket.started_height
        top = float(CHART_HEIGHT)
        for value, words in ENDED_OUTCOMES:
            count = bucket.ended.get(value, 0)
            if count:
                height = count * scale
                top -= height
                bucket.segments.append(Segment(outcome=value, words=words, count=count, y=top, height=height))


def _lay_out_rows(rows: list[DurationRow]) -> list[DurationRow]:
    longest = max([1e-9, *(row.p95 or 0 for row in rows)])
    for n, row in enumerate(rows):
        row.y = n * BAR_ROW_HEIGHT
        row.p95_width = BAR_WIDTH * (row.p95 or 0) / longest
        row.p50_width = BAR_WIDTH * (row.p50 or 0) / longest
    return rows


def _answer_times(user, *, since: datetime.datetime) -> list[DurationRow]:
    """Per server, how long people took to answer the requests asked since `since` (a default applied at a
    deadline is no person's answer): through (state, created_at)."""
    if permissions.sees_all_tasks(user):
        rows = compiled_rows(("answer times",), _answer_time_rows, [since])
    else:
        rows = _answer_time_rows(since, servers=permissions.servers_user_may_approve(user))
    return _lay_out_rows(
        [
            DurationRow(label=name, server=name, count=n, p50=p50, p95=p95, href=tasks_href(server=server_id))
            for server_id, name, n, p50, p95 in rows
        ]
    )


def _answer_time_rows(since: datetime.datetime, servers=None):
    requests = InputRequest.objects.filter(
        state__in=(InputRequestState.ANSWERED, InputRequestState.DELIVERED),
        created_at__gte=since,
        answered_at__isnull=False,
        answered_by__isnull=False,
    )
    if servers is not None:
        requests = requests.filter(server__in=servers)
    seconds = Seconds(F("answered_at"), F("created_at"))
    return (
        requests.order_by()
        .values_list("server_id", "server__name")
        .annotate(n=Count("*"), p50=Median(seconds), p95=P95(seconds))
        .order_by("-p95", "server__name")[:SERVERS_SHOWN]
    )


def _slowest_tools(user, *, since: datetime.datetime) -> list[DurationRow]:
    """The tools whose tasks that ended since `since` took longest at p95, started to ended: through task_finished."""
    return _lay_out_rows(
        [
            DurationRow(
                label=tool,
                server=name,
                count=n,
                p50=p50,
                p95=p95,
                href=tasks_href(server=server_id, tool=tool, ended="24h"),
            )
            for tool, server_id, name, n, p50, p95 in visible_rows(user, "slowest tools", _slowest_tool_rows, since)
        ]
    )


def _slowest_tool_rows(visible, since: datetime.datetime):
    seconds = Seconds(F("finished_at"), F("created_at"))
    return (
        visible.filter(finished_at__gte=since)
        .order_by()
        .values_list("tool", "server_id", "server__name")
        .annotate(n=Count("*"), p50=Median(seconds), p95=P95(seconds))
        .order_by("-p95", "tool")[:SLOWEST_SHOWN]
    )


def trends(user, *, now: datetime.datetime | None = None) -> Trends | None:
    """Home's charts for `user`; None for someone who sees no tasks (Home shows them no trends)."""
    if not (permissions.is_operator(user) or permissions.is_approver(user)):
        return None
    now = now or timezone.now()
    visible = tasks_visible_to(user)
    week = floor_to(now, "day") - DAY * (WEEK_DAYS - 1)
    hours = hour_counts(user, visible, first=week, now=now)
    return Trends(
        per_hour=_chart(hours, unit="hour", count=24, now=now),
        per_day=_chart(hours, unit="day", count=WEEK_DAYS, now=now),
        answer_times=_answer_times(user, since=now - DAY),
        slowest_tools=_slowest_tools(user, since=now - DAY),
    )
