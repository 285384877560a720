"""Issue 15 items 1, 2, 4 through Django's test client on the real database: the task list's outcomes, search,
filters and their errors, times and durations; the signed-in home; Run again.
In a browser: tests/browser/test_control_room.py.
"""

import datetime
import re

import pytest
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.html import escape
from django.utils.timesince import timesince
from django.utils.translation import gettext as _

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.mcp.client import TaskCreated, ToolCompleted
from taskhub.servers.services import create_server, record_server_failure
from taskhub.tasks import dashboard, queries, services
from taskhub.tasks.models import Task, TaskStatus
from taskhub.tasks.outcomes import PREVIEW_CHARS
from taskhub.tasks.presenters import duration_words
from taskhub.web.templatetags.taskhub_ui import calendar_relative_words, duration_text, reltime
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot
from tests.inbox_fixtures import request_of, task_asking

pytestmark = pytest.mark.django_db

XSS = '<img src=x onerror="alert(1)">'
DECLINE_FORM = {
    "method": "elicitation/create",
    "params": {"message": "Go?", "requestedSchema": {"type": "object", "properties": {}}},
}


@pytest.fixture
def alpha():
    return create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)


@pytest.fixture
def olga():
    return make_user("olga", OPERATORS)


@pytest.fixture
def amy():
    return make_user("amy", APPROVERS)


def client_for(client, user):
    client.force_login(user)
    return client


def durable(server, user, tool="deploy", arguments=None, status="working", **fields) -> Task:
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments=arguments or {}, user=user)
    remote = f"remote-{task.pk.hex[:12]}"
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=remote)))
    if status != "working" or fields:
        services.apply_snapshot(task=task, snapshot=snapshot(status, task_id=remote, **fields))
    task.refresh_from_db()
    return task


def completed(server, user, result, tool="render") -> Task:
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments={}, user=user)
    return services.record_launch_outcome(task=task, outcome=ToolCompleted(result=result))


def row_outcomes(page: str) -> dict[str, str]:
    """task id -> the data-outcome of its row ("" for a dash)."""
    rows = re.findall(r'<tr id="task-row-([0-9a-f-]+)".*?</tr>', page, re.S)
    found = {}
    for task_id in rows:
        row = re.search(rf'<tr id="task-row-{task_id}".*?</tr>', page, re.S).group(0)
        match = re.search(r'data-outcome="([a-z_]+)"', row)
        found[task_id] = match.group(1) if match else ""
    return found


@pytest.fixture
def ended(alpha, olga, amy):
    clean = completed(alpha, olga, {"content": [{"type": "text", "text": "all good"}]})
    with_error = completed(alpha, olga, {"content": [{"type": "text", "text": "disk full"}], "isError": True})
    failed = durable(
        alpha, olga, status="failed", error={"code": -32050, "message": "boom"}, statusMessage="it went boom"
    )
    cancelled = durable(alpha, olga)
    services.request_cancel(task=cancelled, user=olga)
    services.apply_snapshot(task=cancelled, snapshot=snapshot("cancelled", task_id=cancelled.remote_task_id))
    declined = task_asking(alpha, {"go": DECLINE_FORM})
    services.answer_input(input_request=request_of(declined, "go"), response={"action": "decline"}, user=amy)
    services.apply_snapshot(task=declined, snapshot=snapshot("cancelled", task_id=f"r-{declined.id}"))
    # The stdio branch adds TaskStatus "lost"; the list knows it by its value already.
    lost = durable(alpha, olga)
    Task.objects.filter(pk=lost.pk).update(status="lost", finished_at=timezone.now())
    running = durable(alpha, olga, tool="approve_deploy", arguments={"target": "prod-eu"})
    return {
        "completed": clean,
        "completed_error": with_error,
        "failed": failed,
        "cancelled": cancelled,
        "declined": declined,
        "lost": lost,
        "": running,
    }


def test_the_outcome_column_tells_every_ending_apart(client, olga, ended):
    page = client_for(client, olga).get(reverse("tasks:list")).content.decode()
    assert row_outcomes(page) == {str(task.pk): outcome for outcome, task in ended.items()}
    assert "by olga" in page  # who cancelled
    assert "(-32050)" in page  # the failure's code
    assert "completed with error" in page


@pytest.mark.parametrize("outcome", ["completed", "completed_error", "declined", "cancelled", "failed", "lost"])
def test_the_outcome_filter_finds_exactly_its_tasks(client, olga, ended, outcome):
    page = client_for(client, olga).get(reverse("tasks:list"), {"outcome": outcome}).content.decode()
    assert set(row_outcomes(page)) == {str(ended[outcome].pk)}


def test_the_result_preview_is_one_escaped_capped_line(client, olga, alpha):
    completed(alpha, olga, {"content": [{"type": "text", "text": XSS + "x" * 5000}]})
    page = client_for(client, olga).get(reverse("tasks:list")).content.decode()
    assert XSS not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert "x" * PREVIEW_CHARS not in page


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("prod-eu", "running"),  # an argument's value
        ("DISK FULL", "completed_error"),  # result text, any case
        ("approve_dep", "running"),  # part of a tool's name
        ("boom", "failed"),  # the status message
    ],
)
def test_search_looks_in_arguments_results_tools_and_messages(client, olga, ended, query, expected):
    key = "" if expected == "running" else expected
    page = client_for(client, olga).get(reverse("tasks:list"), {"q": query}).content.decode()
    assert set(row_outcomes(page)) == {str(ended[key].pk)}


def test_search_finds_a_task_by_our_id_prefix_and_by_the_servers_id(client, olga, ended):
    task = ended["failed"]
    for query in (str(task.pk)[:8], str(task.pk), task.remote_task_id):
        page = client_for(client, olga).get(reverse("tasks:list"), {"q": query}).content.decode()
        assert set(row_outcomes(page)) == {str(task.pk)}, query


def test_tool_filter_matches_part_of_a_name(client, olga, ended):
    page = client_for(client, olga).get(reverse("tasks:list"), {"tool": "appr"}).content.decode()
    assert set(row_outcomes(page)) == {str(ended[""].pk)}


def test_my_tasks_and_the_date_range(client, olga, alpha, ended):
    other = make_user("otto", OPERATORS)
    theirs = durable(alpha, other)
    page = client_for(client, olga).get(reverse("tasks:list"), {"mine": "on"}).content.decode()
    ids = set(row_outcomes(page))
    assert str(theirs.pk) not in ids and str(ended["failed"].pk) in ids
    Task.objects.filter(pk=theirs.pk).update(created_at=timezone.now() - datetime.timedelta(days=10))
    today = timezone.now().date()
    page = client.get(
        reverse("tasks:list"),
        {"since": str(today - datetime.timedelta(days=11)), "until": str(today - datetime.timedelta(days=9))},
    ).content.decode()
    assert set(row_outcomes(page)) == {str(theirs.pk)}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "bogus"}, "There is no status “bogus”"),
        ({"outcome": "great"}, "There is no outcome “great”"),
        ({"since": "yesterday"}, "“From” must be a date"),
        ({"since": "2026-12-02", "until": "2026-12-01"}, "is before “From”"),
        ({"needs": "love"}, "“love” is not a kind of attention"),
    ],
)
def test_an_invalid_filter_says_so_and_the_others_still_apply(client, olga, ended, params, message):
    page = client_for(client, olga).get(reverse("tasks:list"), {**params, "tool": "approve"}).content.decode()
    assert 'id="filter-errors"' in page and message in page
    assert set(row_outcomes(page)) == {str(ended[""].pk)}


NBSP = "\xa0"


def test_relative_times_say_what_timesince_says_in_both_languages_whatever_the_span():
    """reltime makes its words once per language and number of minutes (under four weeks): they must be the words
    timesince gives for the real times, on either side of every unit's boundary and past the four weeks."""
    now = timezone.now()
    spans = [61, 119, 3599, 3600, 3661, 86_399, 86_400, 6 * 86_400 + 86_399, 7 * 86_400, 27 * 86_400 + 86_399]
    spans += [28 * 86_400 + 1, 45 * 86_400, 400 * 86_400]
    for language in ("en", "zh-hans"):
        with translation.override(language):
            for seconds in spans:
                # reltime reads the clock a moment later: ago only grows (may sit on a boundary); ahead is mid-minute
                ago, ahead = now - datetime.timedelta(seconds=seconds), now + datetime.timedelta(seconds=seconds + 30)
                said_ago = _("%(time)s ago") % {"time": timesince(ago, now, depth=1)}
                counted_to = ahead + datetime.timedelta(seconds=59)
                said_ahead = _("in %(time)s") % {"time": timesince(now, counted_to, depth=1)}
                assert f">{escape(said_ago.replace(NBSP, ' '))}</time>" in reltime(ago), (language, seconds)
                assert f">{escape(said_ahead.replace(NBSP, ' '))}</time>" in reltime(ahead), (language, seconds)


def test_relative_times_past_four_weeks_say_what_timesince_says_whatever_the_calendar():
    """Past four weeks reltime makes its words once per language and number of calendar months: across month ends,
    leap days and times of day they must be timesince's own words for those two times."""
    nows = [
        datetime.datetime(2026, 3, 31, 23, 59, 59, tzinfo=datetime.UTC),
        datetime.datetime(2028, 2, 29, 0, 0, 1, tzinfo=datetime.UTC),
        datetime.datetime(2026, 12, 1, 12, 30, tzinfo=datetime.UTC),
        datetime.datetime(2027, 1, 15, 6, 0, tzinfo=datetime.UTC),
    ]
    offsets = [datetime.timedelta(days=days, hours=hours) for days in range(28, 800, 1) for hours in (0, 11, 23)]
    for language in ("en", "zh-hans"):
        with translation.override(language):
            for now in nows:
                for offset in offsets:
                    ago, ahead = now - offset, now + offset
                    said_ago = _("%(time)s ago") % {"time": timesince(ago, now, depth=1)}
                    said_ahead = _("in %(time)s") % {
                        "time": timesince(now, ahead + datetime.timedelta(seconds=59), depth=1)
                    }
                    assert calendar_relative_words(ago, now) == escape(said_ago.replace(NBSP, " ")), (
                        language,
                        now,
                        ago,
                    )
                    assert calendar_relative_words(ahead, now) == escape(said_ahead.replace(NBSP, " ")), (
                        language,
                        now,
                        ahead,
                    )


def test_the_inbox_reports_its_invalid_filters_the_same_way(client, amy):
    page = client_for(client, amy).get(reverse("tasks:inbox"), {"page": "x"}).content.decode()
    assert "The page must be a whole number" in page


def test_times_under_a_minute_are_just_now_and_one_day_is_singular():
    now = timezone.now()
    assert "just now" in reltime(now - datetime.timedelta(seconds=50))
    assert "1 minute ago" in reltime(now - datetime.timedelta(seconds=61))
    assert "0 minutes" not in reltime(now + datetime.timedelta(seconds=55))
    # Issue 34 item 8: a token made "in 7 days", shown a moment later, was "in 6 days" (every unit floored).
    assert "in 1 week" in reltime(now + datetime.timedelta(days=7, seconds=-3))
    assert "in 6 days" in reltime(now + datetime.timedelta(days=6, hours=23, minutes=58))
    assert "in 2 hours" in reltime(now + datetime.timedelta(hours=2, seconds=-1))
    assert duration_words(86_400_000) == "1 day"
    assert duration_words(2 * 86_400_000) == "2 days"
    assert duration_text(90) == "1 min 30 s"
    assert duration_text(86_400 + 3600) == "1 day 1 h"
    # One formatter for every duration (taskhub/tasks/durations.py): a task's run, Home's percentiles, a TTL.
    assert (duration_text(0.02), duration_text(5), duration_text(3.25)) == ("20 ms", "5 s", "3.2 s")
    assert duration_words(90_000) == "1 min 30 s" and duration_words(5_000) == "5 s"


def test_the_list_shows_durations(client, olga, alpha):
    task = completed(alpha, olga, {"content": []})
    Task.objects.filter(pk=task.pk).update(finished_at=task.created_at + datetime.timedelta(seconds=125))
    row = re.search(
        r'class="nowrap task-duration">([^<]*)<', client_for(client, olga).get(reverse("tasks:list")).content.decode()
    )
    assert row.group(1) == "2 min 5 s"


# --- the signed-in home ------------------------------------------------------------------------------------------


def count_in(page: str, attribute: str, value: str) -> int:
    item = re.search(rf'<li {attribute}="{value}">(.*?)</li>', page, re.S).group(1)
    return int(re.search(r'dash-count[^"]*">(\d+)<', item).group(1))


def test_the_home_of_an_operator_counts_what_needs_attention_and_links_to_it(client, olga, alpha, ended):
    unknown = durable(alpha, olga)
    Task.objects.filter(pk=unknown.pk).update(status=TaskStatus.LAUNCH_UNKNOWN)
    stuck = durable(alpha, olga)
    services.request_cancel(task=stuck, user=olga)
    Task.objects.filter(pk=stuck.pk).update(cancel_requested_at=timezone.now() - datetime.timedelta(minutes=5))
    services.record_protocol_error_once(task=stuck, data={"problem": "odd"})
    record_server_failure(server=alpha, error="connection refused")

    page = client_for(client, olga).get("/").content.decode()
    assert 'id="dashboard"' in page
    assert count_in(page, "data-needs", "launch_unknown") == 1
    assert count_in(page, "data-needs", "cancel_not_honoured") == 1
    assert count_in(page, "data-needs", "protocol_error") == 1
    for outcome in ("completed", "completed_error", "declined", "cancelled", "failed", "lost"):
        assert count_in(page, "data-outcome", outcome) == 1, outcome
    assert 'href="/tasks/?outcome=declined&amp;ended=24h"' in page
    assert 'href="/tasks/?needs=cancel_not_honoured"' in page
    assert f'data-server="{alpha.pk}"' in page and "unreachable" in page
    # my running tasks: the approval still working and the stuck one, linked to the list of them
    assert 'href="/tasks/?mine=on&amp;status=running"' in page

    # every link leads to a list of exactly what was counted
    listed = client.get("/tasks/?needs=cancel_not_honoured").content.decode()
    assert set(row_outcomes(listed)) == {str(stuck.pk)}
    listed = client.get("/tasks/?mine=on&status=running").content.decode()
    assert str(stuck.pk) in listed and str(ended["failed"].pk) not in listed


def test_the_home_of_an_approver_says_what_waits_and_since_when(client, amy, alpha):
    task_asking(alpha, {"a": DECLINE_FORM, "b": DECLINE_FORM})
    page = client_for(client, amy).get("/").content.decode()
    assert re.search(r'data-count="2">2</a> open requests', page)
    assert "The oldest was asked" in page
    assert 'id="dash-mine"' not in page and 'id="dash-servers"' not in page  # an approver launches nothing
    fragment = client.get("/?fragment=dashboard", headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith('<div id="dashboard"') and "<html" not in fragment


def test_expiring_within_the_hour_counts_the_running_tasks_whose_ttl_ends_within_it(client, olga, alpha):
    # The server's createdAt + ttlMs, as it says them (taskhub's own created_at, a moment ago, plays no part).
    an_hour_ago = (timezone.now() - datetime.timedelta(hours=1)).isoformat()
    soon = durable(alpha, olga, created_at=an_hour_ago, ttl_ms=90 * 60 * 1000)
    later = durable(alpha, olga, created_at=an_hour_ago, ttl_ms=150 * 60 * 1000)
    durable(alpha, olga, status="completed", created_at=an_hour_ago, ttl_ms=90 * 60 * 1000)
    durable(alpha, olga, created_at=an_hour_ago, ttl_ms=None)
    assert later.expires_at - soon.expires_at == datetime.timedelta(hours=1)

    page = client_for(client, olga).get("/").content.decode()
    assert count_in(page, "data-needs", "expiring") == 1
    listed = client.get("/tasks/?needs=expiring").content.decode()
    assert set(row_outcomes(listed)) == {str(soon.pk)}


def test_past_the_cap_the_home_says_how_many_at_least(client, amy, alpha, monkeypatch):
    monkeypatch.setattr(queries, "COUNT_CAP", 1)
    monkeypatch.setattr(dashboard, "COUNT_CAP", 1)
    task_asking(alpha, {"a": DECLINE_FORM, "b": DECLINE_FORM})
    page = client_for(client, amy).get("/").content.decode()
    assert re.search(r'data-count="2">1\+</a> open requests', page)
    assert "The oldest was asked" in page


def test_anonymous_visitors_keep_the_public_page(client):
    page = client.get("/").content.decode()
    assert "The control room for long-running MCP tool calls" in page and 'id="dashboard"' not in page
    assert 'id="dashboard"' not in client.get("/?fragment=dashboard").content.decode()


# --- Run again ------------------------------------------------------------------------------------------------


def test_run_again_fills_the_launch_form_with_the_tasks_arguments(client, olga, alpha):
    schema = {"type": "object", "properties": {"target": {"type": "string"}, "count": {"type": "integer"}}}
    task = services.launch(
        server=with_tools(alpha, {"name": "deploy", "inputSchema": schema}),
        tool="deploy",
        arguments={"target": "prod-eu", "count": 3},
        user=olga,
    )
    detail = client_for(client, olga).get(reverse("tasks:detail", args=[task.pk])).content.decode()
    href = f"/launch/{alpha.pk}/deploy/?again={task.pk}"
    assert f'href="{href}"' in detail
    form = client.get(href).content.decode()
    assert 'id="run-again-notice"' in form
    assert 'value="prod-eu"' in form and 'value="3"' in form
    # a task id of another tool, or nonsense, starts from the schema's defaults
    other = client.get(f"/launch/{alpha.pk}/deploy/?again=nonsense").content.decode()
    assert "prod-eu" not in other and 'id="run-again-notice"' not in other


def test_an_approver_is_not_offered_run_again(client, amy, alpha):
    task = task_asking(alpha, {"a": DECLINE_FORM})
    detail = client_for(client, amy).get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "Run again" not in detail


def test_homes_counts_in_one_statement_are_each_querysets_capped_count(olga, alpha, monkeypatch):
    """queries.capped_counts: Home's counts, read together, are each queryset's count stopped at the cap, as
    capped_count's (which reads one the same way), past the cap too."""
    for _running in range(3):
        durable(alpha, olga)
    durable(alpha, olga, status="completed")
    monkeypatch.setattr(queries, "COUNT_CAP", 2)
    tasks = Task.objects.all()
    querysets = [
        tasks,
        tasks.filter(status=TaskStatus.COMPLETED),
        tasks.filter(status=TaskStatus.LOST),
        tasks.filter(launched_by=olga).select_related("server").order_by("-created_at"),
    ]
    counted_alone = [each.order_by()[: queries.COUNT_CAP + 1].count() for each in querysets]  # Django's own count
    assert queries.capped_counts(querysets) == counted_alone == [3, 1, 0, 3]
    assert [queries.capped_count(each) for each in querysets] == counted_alone
    assert queries.capped_counts([]) == []


def test_the_lists_links_follow_the_script_prefix_and_leave_out_empty_filters():
    """list_links.tasks_href reverses the list's path once per URLconf, script prefix and language."""
    from django.urls import get_script_prefix, set_script_prefix

    from taskhub.tasks.list_links import tasks_href

    before = get_script_prefix()
    try:
        assert tasks_href(outcome="failed", ended="24h", server="", tool=None) == "/tasks/?outcome=failed&ended=24h"
        set_script_prefix("/taskhub/")
        assert tasks_href() == "/taskhub/tasks/"
        assert tasks_href(needs="expiring") == "/taskhub/tasks/?needs=expiring"
    finally:
        set_script_prefix(before)
    assert tasks_href() == "/tasks/"
