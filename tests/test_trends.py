"""Issue 34 deliver 3: Home's trends (taskhub/tasks/trends.py), counted exactly for tasks placed in time, for what a
person may see, and when there is nothing. In a browser: tests/browser/test_control_room.py."""

import datetime
import re

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.utils import timezone

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.approvals.services import create_policy
from taskhub.servers.services import create_server
from taskhub.tasks.models import InputRequest, Task, TaskStatus
from taskhub.tasks.trends import trends
from taskhub.web.templatetags import taskhub_rows
from taskhub.web.templatetags.taskhub_ui import svg_number
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db

# A fixed "now", 40 minutes into an hour: the hours before the current one are settled (kept in the cache).
NOW = datetime.datetime(2026, 12, 4, 15, 40, tzinfo=datetime.UTC)
HOUR = datetime.timedelta(hours=1)


@pytest.fixture(autouse=True)
def no_kept_hours():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def alpha():
    return create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)


@pytest.fixture
def beta():
    """A server whose policy names a group amy is not in: she sees none of its tasks."""
    server = create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=None)
    create_policy(server=server, tool="", groups=[Group.objects.create(name="finance")], user=None)
    return server


def placed(server, *, started, ended=None, status=TaskStatus.COMPLETED, tool="deploy", **fields) -> Task:
    task = Task.objects.create(server=server, tool=tool, status=status, **fields)
    Task.objects.filter(pk=task.pk).update(created_at=started, finished_at=ended)
    return task


def answer(task, *, asked, after, action="accept", user=None):
    request = InputRequest.objects.create(
        task=task,
        key=f"q-{asked.timestamp()}",
        method="elicitation/create",
        state="answered",
        answer={"action": action},
        answered_by=user,
        answered_at=asked + after,
    )
    InputRequest.objects.filter(pk=request.pk).update(created_at=asked)
    return request


def bucket(chart, start):
    return next(bucket for bucket in chart.buckets if bucket.start == start)


def test_started_and_ended_per_hour_and_per_day_by_outcome(alpha):
    olga = make_user("olga", OPERATORS)
    amy = make_user("amy", APPROVERS)
    two_hours_ago = NOW.replace(minute=0) - 2 * HOUR  # 13:00
    placed(
        alpha,
        started=two_hours_ago + datetime.timedelta(minutes=5),
        ended=two_hours_ago + datetime.timedelta(minutes=50),
    )
    placed(alpha, started=two_hours_ago, ended=two_hours_ago + datetime.timedelta(minutes=1), result={"isError": True})
    failed = placed(alpha, started=NOW - 3 * 24 * HOUR, ended=NOW - 3 * 24 * HOUR, status=TaskStatus.FAILED)
    declined = placed(alpha, started=NOW - datetime.timedelta(minutes=30), ended=NOW, status=TaskStatus.CANCELLED)
    answer(
        declined,
        asked=NOW - datetime.timedelta(minutes=20),
        after=datetime.timedelta(seconds=90),
        action="decline",
        user=amy,
    )
    placed(alpha, started=NOW - datetime.timedelta(minutes=10), status=TaskStatus.WORKING)
    placed(alpha, started=NOW - 8 * 24 * HOUR, ended=NOW - 8 * 24 * HOUR)  # before the week

    board = trends(olga, now=NOW)
    again = trends(olga, now=NOW)  # the settled hours now from the cache: the same counts
    for seen in (board, again):
        hour = bucket(seen.per_hour, two_hours_ago)
        assert (hour.started, hour.ended["completed"], hour.ended["completed_error"]) == (2, 1, 1)
        current = seen.per_hour.buckets[-1]
        assert current.start == NOW.replace(minute=0)
        assert (current.started, current.ended["declined"], current.ended["cancelled"]) == (2, 1, 0)
        assert seen.per_hour.started_total == 4 and seen.per_hour.ended_total == 3
        today = seen.per_day.buckets[-1]
        assert (today.started, today.ended_total) == (4, 3)
        three_days = bucket(seen.per_day, (NOW - 3 * 24 * HOUR).replace(hour=0, minute=0))
        assert (three_days.started, three_days.ended["failed"]) == (1, 1)
        assert seen.per_day.started_total == 5 and seen.per_day.ended_total == 4
    legend = {item.outcome: (item.total, item.href) for item in board.per_day.legend}
    assert legend["failed"] == (1, "/tasks/?outcome=failed&ended=7d")
    assert legend["declined"][0] == 1 and legend["completed"][0] == 1
    assert (
        bucket(board.per_day, three_days.start).href
        == f"/tasks/?since={three_days.start.date()}&until={three_days.start.date()}"
    )
    assert failed.pk  # counted on its day, not in the 24 hours
    assert board.per_hour.legend[[i.outcome for i in board.per_hour.legend].index("failed")].total == 0


def test_durations_and_answer_times_at_p50_and_p95(alpha):
    olga = make_user("olga", OPERATORS)
    amy = make_user("amy", APPROVERS)
    for minutes in range(1, 11):  # 1 … 10 minutes long
        task = placed(
            alpha, started=NOW - 2 * HOUR, ended=NOW - 2 * HOUR + minutes * datetime.timedelta(minutes=1), tool="render"
        )
        answer(task, asked=NOW - 2 * HOUR, after=datetime.timedelta(seconds=10 * minutes), user=amy)
    placed(alpha, started=NOW - HOUR, ended=NOW - HOUR + datetime.timedelta(seconds=5), tool="ping")
    by_default = placed(alpha, started=NOW - HOUR, ended=NOW)
    answer(by_default, asked=NOW - HOUR, after=HOUR)  # applied at a deadline: nobody's answer

    board = trends(olga, now=NOW)
    slowest = [(row.label, row.count, row.p50, row.p95) for row in board.slowest_tools]
    # slowest first; percentile_cont over 60 … 600 s
    assert slowest == [
        ("deploy", 1, 3600.0, 3600.0),
        ("render", 10, 330.0, pytest.approx(573.0)),
        ("ping", 1, 5.0, 5.0),
    ]
    assert board.slowest_tools[1].href == f"/tasks/?server={alpha.pk}&tool=render&ended=24h"
    [answers] = board.answer_times
    assert (answers.label, answers.count, answers.p50, answers.p95) == ("alpha", 10, 55.0, pytest.approx(95.5))
    assert answers.p95_text == "1 min 35 s" and answers.p50_text == "55 s"


def test_an_approver_sees_the_trends_of_their_servers_only(alpha, beta):
    amy = make_user("amy", APPROVERS)
    olga = make_user("olga", OPERATORS)
    mine = placed(alpha, started=NOW - 2 * HOUR, ended=NOW - HOUR, tool="mine")
    answer(mine, asked=NOW - 2 * HOUR, after=datetime.timedelta(seconds=30), user=olga)
    theirs = placed(beta, started=NOW - 2 * HOUR, ended=NOW - HOUR, status=TaskStatus.FAILED, tool="theirs")
    answer(theirs, asked=NOW - 2 * HOUR, after=datetime.timedelta(seconds=30), user=olga)

    for_amy = trends(amy, now=NOW)  # first: her settled hours go into the cache under her own servers
    for_olga = trends(olga, now=NOW)
    assert (for_amy.per_day.started_total, for_amy.per_day.ended_total) == (1, 1)
    assert {item.outcome: item.total for item in for_amy.per_day.legend}["failed"] == 0
    assert [row.label for row in for_amy.slowest_tools] == ["mine"]
    assert [row.label for row in for_amy.answer_times] == ["alpha"]
    assert (for_olga.per_day.started_total, for_olga.per_day.ended_total) == (2, 2)
    assert sorted(row.label for row in for_olga.answer_times) == ["alpha", "beta"]


def test_nothing_yet_and_no_role(client, alpha):
    olga = make_user("olga", OPERATORS)
    board = trends(olga)
    assert board.per_hour.started_total == 0 and board.per_day.ended_total == 0
    assert len(board.per_hour.buckets) == 24 and len(board.per_day.buckets) == 7
    assert board.slowest_tools == [] and board.answer_times == []
    assert trends(make_user("nobody")) is None

    client.force_login(olga)
    page = client.get("/").content.decode()
    assert 'id="trends"' in page and "No task ended in the last 24 hours." in page
    fragment = client.get("/?fragment=trends", headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith('<section id="trends"') and "<html" not in fragment
    client.force_login(make_user("nobody2"))
    assert 'id="trends"' not in client.get("/").content.decode()


def test_the_charts_numbers_are_plain_decimals_in_every_language(client, alpha, settings):
    """The SVG's coordinates (taskhub_ui.svg_number): two decimals and a dot, never grouped or localised."""
    settings.USE_THOUSAND_SEPARATOR = True
    assert [svg_number(value) for value in (0, 1.5, 12345.678, 2)] == ["0.00", "1.50", "12345.68", "2.00"]
    olga = make_user("olga", OPERATORS)
    now = timezone.now()
    placed(alpha, started=now - 3 * HOUR, ended=now - 2 * HOUR)
    client.force_login(olga)
    for language in ("en", "zh-hans"):
        fragment = client.get(
            "/?fragment=trends", headers={"HX-Request": "true", "Accept-Language": language}
        ).content.decode()
        numbers = re.findall(
            r'<rect class="bar-[a-z_]+" x="([^"]*)" y="([^"]*)" width="([^"]*)" height="([^"]*)"', fragment
        )
        assert numbers, language
        assert all(re.fullmatch(r"\d+\.\d\d", number) for rect in numbers for number in rect), (language, numbers[:3])


def test_a_chart_draws_each_bucket_as_its_words_and_two_bars_stacked_by_outcome(alpha, monkeypatch):
    """taskhub_ui.trend_svg: per bucket a <g> titled with its counts in the reader's language, its started bar as
    tall as the busiest bucket allows and its ended bars stacked by outcome in the legend's order, one on another."""
    from django.utils import translation

    from taskhub.tasks.trends import CHART_HEIGHT
    from taskhub.web.templatetags import taskhub_ui
    from taskhub.web.templatetags.taskhub_ui import trend_svg

    olga = make_user("olga", OPERATORS)
    one = NOW.replace(minute=0) - HOUR  # 14:00
    for ended, fields in ((10, {}), (20, {}), (30, {"result": {"isError": True}})):
        placed(alpha, started=one, ended=one + datetime.timedelta(minutes=ended), **fields)
    placed(alpha, started=one, status=TaskStatus.WORKING)
    chart = trends(olga, now=NOW).per_hour
    with translation.override("en"):
        drawn = str(trend_svg(chart))
    assert drawn.startswith('<svg class="trend-svg" viewBox="0 0 288.0 120"') and drawn.endswith("</svg>")
    groups = re.findall(r"<g>(.*?)</g>", drawn)
    assert len(groups) == 24
    hour = groups[chart.buckets.index(bucket(chart, one))]
    assert "<title>14:00: 4 started, 3 ended</title>" in hour
    bars = re.findall(r'<rect class="bar-([a-z_]+)" x="([^"]*)" y="([^"]*)" width="([^"]*)" height="([^"]*)"', hour)
    assert [bar[0] for bar in bars] == ["started", "completed", "completed_error"]
    started, completed, errored = ([float(number) for number in bar[1:]] for bar in bars)
    assert started[1:] == [2.0, 4.8, 118.0]  # the busiest bucket: the chart's height less two
    assert completed[0] == errored[0] == started[0] + 4.8  # side by side with the started bar
    assert completed[2:] == [4.8, 59.0] and completed[1] == CHART_HEIGHT - 59.0
    assert errored[2:] == [4.8, 29.5] and errored[1] == completed[1] - 29.5  # on top of the completed
    yesterdays = groups[0]  # the first of the 24 hours
    assert yesterdays.startswith("<title>16:00: 0 started, 0 ended</title>") and yesterdays.count("<rect") == 1
    with translation.override("zh-hans"):
        assert "<title>14:00：4 个已开始，3 个已结束</title>" in str(trend_svg(chart))  # noqa: RUF001
    # A translation naming other values than the message's: the message as written, as {% blocktranslate %} does.
    monkeypatch.setattr(taskhub_ui, "_", lambda message: "%(someone)s")
    assert "<title>14:00: 4 started, 3 ended</title>" in str(trend_svg(chart))


def test_a_charts_table_has_a_row_per_bucket_its_counts_localised(alpha, settings):
    """taskhub_ui.trend_table_rows: what a screen reader reads in place of the bars, the ended in the legend's order;
    the counts as {{ count }} renders them (grouped where the settings say), the labels escaped."""
    from taskhub.tasks.trends import ENDED_OUTCOMES, Bucket, Chart
    from taskhub.web.templatetags.taskhub_ui import trend_table_rows

    olga = make_user("olga", OPERATORS)
    one = NOW.replace(minute=0) - HOUR  # 14:00
    for ended, fields in ((10, {}), (20, {}), (30, {"result": {"isError": True}})):
        placed(alpha, started=one, ended=one + datetime.timedelta(minutes=ended), **fields)
    chart = trends(olga, now=NOW).per_hour
    rows = str(trend_table_rows(chart)).splitlines()
    assert (
        len(rows) == 24
        and rows[0] == '<tr><th scope="row">16:00</th>' + "<td>0</td>" * (1 + len(ENDED_OUTCOMES)) + "</tr>"
    )
    ended = {"completed": 2, "completed_error": 1}
    cells = "".join(f"<td>{ended.get(value, 0)}</td>" for value, _ in ENDED_OUTCOMES)
    assert rows[-2] == f'<tr><th scope="row">14:00</th><td>3</td>{cells}</tr>'
    settings.USE_THOUSAND_SEPARATOR = True
    odd = Chart(key="24h", title="", legend=[], started_total=0, started_href="", buckets=[])
    odd.buckets.append(Bucket(start=NOW, label="<b>", started=12345, ended={"failed": 1000}))
    assert str(trend_table_rows(odd)).startswith('<tr><th scope="row">&lt;b&gt;</th><td>12,345</td>')
    assert "<td>1,000</td>" in str(trend_table_rows(odd))


def test_the_kept_section_is_the_section_rendered_afresh_after_each_change_it_shows(client, alpha, monkeypatch):
    """Home keeps the trends' HTML under all they show (trends.Trends.shown, {% kept %}): after each change, the
    section is the one rendered with nothing kept, and not the one before."""
    olga = make_user("olga", OPERATORS)
    amy = make_user("amy", APPROVERS)
    client.force_login(olga)
    # Mid-day, 40 minutes into an hour: an hour later is the same day (the day's links read the same).
    now = timezone.now().replace(hour=12, minute=40)
    monkeypatch.setattr(timezone, "now", lambda: now)

    def section(language="en") -> str:
        headers = {"HX-Request": "true", "Accept-Language": language}
        return client.get("/?fragment=trends", headers=headers).content.decode()

    def afresh(language="en") -> str:
        monkeypatch.setattr(taskhub_rows, "_kept", {})
        return section(language)

    def shows(change, language="en") -> None:
        before = section(language)
        assert section(language) == before  # kept
        change()
        after = section(language)
        assert after != before, change.__name__
        assert after == afresh(language), change.__name__

    def started():
        placed(alpha, started=timezone.now(), status=TaskStatus.WORKING)

    def ended():
        placed(alpha, started=now - datetime.timedelta(minutes=1), ended=now, status=TaskStatus.FAILED)

    def slower():
        placed(alpha, started=now - 5 * HOUR, ended=now, tool="slow")

    def slower_still():  # started an hour earlier, in hours kept as they were counted: only its duration shows
        Task.objects.filter(tool="slow").update(created_at=now - 6 * HOUR)

    def answered():
        asked = placed(alpha, started=now - HOUR, status=TaskStatus.WORKING)
        answer(asked, asked=now - datetime.timedelta(minutes=30), after=datetime.timedelta(minutes=7), user=amy)

    def answered_later():  # the same requests and tasks: only a time to answer is longer
        InputRequest.objects.update(answered_at=now)

    def an_hour_passes():  # the same counts, each an hour further back
        monkeypatch.setattr(timezone, "now", lambda: now + HOUR)

    for change in (started, ended, slower, slower_still, answered, answered_later, an_hour_passes):
        shows(change)
    assert section("zh-hans") != section()  # the same trends, kept for each language
    shows(started, language="zh-hans")


def test_a_process_reads_the_settled_hours_once(alpha):
    """What a process has read or counted of the settled hours it keeps (trend_hours.hour_counts): the next Home reads
    neither the shared cache nor the hours again; what it shows is the same."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from taskhub.tasks.trend_hours import forget_kept_hours

    olga = make_user("olga", OPERATORS)
    placed(alpha, started=NOW - 3 * HOUR, ended=NOW - 2 * HOUR)
    placed(alpha, started=NOW - 2 * 24 * HOUR, ended=NOW - 2 * 24 * HOUR, status=TaskStatus.FAILED)
    first = trends(olga, now=NOW)
    with CaptureQueriesContext(connection) as captured:
        again = trends(olga, now=NOW)
    assert not [query for query in captured.captured_queries if "taskhub_cache" in query["sql"]]
    assert again.shown == first.shown
    forget_kept_hours()
    with CaptureQueriesContext(connection) as captured:
        from_the_cache = trends(olga, now=NOW)
    assert [query for query in captured.captured_queries if "taskhub_cache" in query["sql"]]
    assert from_the_cache.shown == first.shown
    assert (first.per_day.started_total, first.per_day.ended_total) == (2, 2)


def test_home_reads_what_ended_once_for_its_counts_and_its_chart(client, alpha):
    """Home's "Ended in the last 24 hours" and its chart's current hour come from one read (trend_hours.ended_per_hour):
    with the week's settled hours kept, Home reads what ended since a moment twice in all, that read's one statement
    (outcomes.outcome_counts_per: per status and declined or not) and the slowest tools'."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    olga = make_user("olga", OPERATORS)
    now = timezone.now()
    placed(alpha, started=now - 2 * HOUR, ended=now - HOUR, status=TaskStatus.FAILED)
    placed(alpha, started=now - 3 * HOUR, ended=now)
    placed(alpha, started=now - 30 * HOUR, ended=now - 25 * HOUR)  # ended before the 24 hours
    client.force_login(olga)
    client.get("/")  # the settled hours, counted and kept
    with CaptureQueriesContext(connection) as captured:
        page = client.get("/").content.decode()
    ended_since = [query["sql"] for query in captured.captured_queries if '"finished_at" >=' in query["sql"]]
    assert len(ended_since) == 2, ended_since
    outcomes = dict(re.findall(r'data-outcome="(\w+)">.*?<span class="dash-count[^"]*">(\d+)</span>', page))
    assert (outcomes["failed"], outcomes["completed"], outcomes["cancelled"]) == ("1", "1", "0")
