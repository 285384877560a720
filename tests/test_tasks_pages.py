"""Task list, task detail and Cancel: filters, counts, paging, who sees what, cancel, result rendering, live."""

import base64
import datetime
import importlib
import json
import re
from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import AnonymousUser
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from taskhub.accounts import permissions
from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.live import task_fragments
from taskhub.live.access import access_for
from taskhub.live.threads import close_live_connections
from taskhub.mcp.client import ToolCompleted
from taskhub.observability.models import TaskStatusDelta
from taskhub.tasks import capped_text, outcomes, presenters, queries, services
from taskhub.tasks.models import Task
from taskhub.tasks.views import listing
from taskhub.tasks.views.listing import PAGE_SIZE
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot
from tests.task_page_fixtures import durable, signed_in

pytestmark = pytest.mark.django_db

PNG_1PX = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a5d4a1d70000000049454e44ae426082"
    )
).decode()
SVG = base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"></svg>').decode()
XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def completed_with(server, user, result: dict) -> Task:
    task = services.launch(server=with_tools(server, "render"), tool="render", arguments={}, user=user)
    return services.record_launch_outcome(task=task, outcome=ToolCompleted(result=result))


@pytest.fixture
def ben():
    """Approves for beta only."""
    return make_user("ben", APPROVERS, "beta-approvers")


def row_ids(response) -> list[str]:
    return re.findall(r'id="task-row-([0-9a-f-]+)"', response.content.decode())


def tab_counts(response) -> dict[str, int]:
    html = response.content.decode()
    return {tab: int(n) for tab, n in re.findall(r'data-tab="(\w+)"[^>]*>[^<]*<span class="count">(\d+)</span>', html)}


# --- who sees what -----------------------------------------------------------------------------------


def test_tasks_visible_to_follows_the_roles_and_live_access_agrees(alpha, beta, olga, amy, ben):
    on_alpha, on_beta = durable(alpha, olga), durable(beta, olga)
    admin, nobody = make_user("alex", ADMINS), make_user("nils")
    expected = {
        olga: {on_alpha, on_beta},
        admin: {on_alpha, on_beta},
        amy: {on_alpha},
        ben: {on_beta},
        nobody: set(),
        AnonymousUser(): set(),
    }
    for user, tasks in expected.items():
        assert set(queries.tasks_visible_to(user)) == tasks, user
        for task in (on_alpha, on_beta):
            assert permissions.may_see_task(user, task) == (task in tasks), (user, task)
            assert access_for(user).may_see_task(task) == (task in tasks), (user, task)


def test_anonymous_is_sent_to_sign_in(client, alpha, olga):
    task = durable(alpha, olga)
    for url in (reverse("tasks:list"), reverse("tasks:detail", args=[task.pk])):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    response = client.post(reverse("tasks:cancel", args=[task.pk]))
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert Task.objects.get(pk=task.pk).cancel_requested_at is None


def test_a_user_without_a_role_is_refused_the_list(client, alpha, olga):
    durable(alpha, olga)
    response = signed_in(client, make_user("nils")).get(reverse("tasks:list"))
    assert response.status_code == 403
    assert "operators, admins and approvers" in response.content.decode()


def test_an_approver_lists_only_the_tasks_of_their_servers(client, alpha, beta, olga, amy):
    on_alpha, on_beta = durable(alpha, olga), durable(beta, olga)
    response = signed_in(client, amy).get(reverse("tasks:list"))
    assert response.status_code == 200
    assert row_ids(response) == [str(on_alpha.pk)]
    assert tab_counts(response)["all"] == 1
    # the server filter offers only the servers whose tasks they see
    assert ">alpha</option>" in response.content.decode() and ">beta</option>" not in response.content.decode()
    assert client.get(reverse("tasks:detail", args=[on_alpha.pk])).status_code == 200
    assert client.get(reverse("tasks:detail", args=[on_beta.pk])).status_code == 404


def test_a_task_nobody_may_see_is_404_not_403(client, alpha, olga, ben):
    task = durable(alpha, olga)
    response = signed_in(client, ben).get(reverse("tasks:detail", args=[task.pk]))
    assert response.status_code == 404
    assert "deploy" not in response.content.decode()
    assert client.get(reverse("tasks:detail", args=["00000000-0000-0000-0000-000000000000"])).status_code == 404


# --- the list: filters, counts, paging ---------------------------------------------------------------


@pytest.fixture
def mixed(alpha, beta, olga):
    wendy = make_user("wendy", OPERATORS)
    return {
        "working": durable(alpha, olga, tool="deploy", statusMessage="copying files"),
        "done": durable(alpha, wendy, tool="backup", status="completed", statusMessage="all copied"),
        "failed": durable(beta, olga, tool="deploy", status="failed", statusMessage="disk full"),
        "cancelled": durable(beta, wendy, tool="report", status="cancelled"),
        "launching": services.launch(server=with_tools(alpha, "deploy"), tool="deploy", arguments={}, user=olga),
        "asking": durable(beta, olga, tool="deploy", status="input_required", statusMessage="waiting for Dana"),
    }


def test_the_list_counts_each_status_and_groups_local_states_as_other(client, olga, mixed):
    response = signed_in(client, olga).get(reverse("tasks:list"))
    assert response.status_code == 200
    assert tab_counts(response) == {
        "all": 6,
        "working": 1,
        "input_required": 1,
        "completed": 1,
        "failed": 1,
        "cancelled": 1,
        "other": 1,
    }
    # newest first
    assert row_ids(response) == [str(task.pk) for task in reversed(list(mixed.values()))]
    # the nav counts the running tasks of all (launching, working, input_required), whatever the list's filter
    assert 'aria-label="running tasks">3</span>' in response.content.decode()
    response = client.get(reverse("tasks:list"), {"server": mixed["working"].server_id})
    assert tab_counts(response)["all"] == 3 and 'aria-label="running tasks">3</span>' in response.content.decode()


@pytest.mark.embedded
def test_a_status_tab_filters_and_the_other_filters_change_the_counts(client, olga, alpha, mixed):
    client = signed_in(client, olga)
    response = client.get(reverse("tasks:list"), {"status": "other"})
    assert row_ids(response) == [str(mixed["launching"].pk)]

    response = client.get(reverse("tasks:list"), {"server": alpha.pk})
    assert set(row_ids(response)) == {str(mixed[k].pk) for k in ("working", "done", "launching")}
    assert tab_counts(response)["all"] == 3 and tab_counts(response)["failed"] == 0
    # the tab links keep the filters (bookmarkable)
    assert f'href="/tasks/?server={alpha.pk}&amp;status=completed"' in response.content.decode()

    response = client.get(reverse("tasks:list"), {"tool": "deploy", "status": "failed"})
    assert row_ids(response) == [str(mixed["failed"].pk)]

    response = client.get(reverse("tasks:list"), {"launched_by": "wendy"})
    assert set(row_ids(response)) == {str(mixed["done"].pk), str(mixed["cancelled"].pk)}

    response = client.get(reverse("tasks:list"), {"q": "COP"})
    assert set(row_ids(response)) == {str(mixed["working"].pk), str(mixed["done"].pk)}
    assert 'value="COP"' in response.content.decode()


@pytest.mark.embedded
def test_the_search_has_its_trigram_index_where_postgres_has_pg_trgm_and_uses_it(alpha, olga, mixed):
    # The embedded Postgres has no pg_trgm: there the search above works without an index (a sequential scan).
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        available = cursor.fetchone() is not None
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'tasks_task' AND indexdef LIKE '%gin_trgm_ops%'"
        )
        indexes = {row[0] for row in cursor.fetchall()}
    # 0005's index on the status message alone is gone (0007): the search compares one text of every field.
    assert indexes == ({"task_search_trgm", "task_tool_trgm"} if available else set())
    if not available:
        return
    # On a few tasks the planner reads them all (a sequential scan, or another index in order with a filter); both
    # forbidden, it shows which index answers each filter.
    for filters, index, found in (
        ({"q": "cop"}, "task_search_trgm", {"working", "done"}),
        ({"tool": "epl"}, "task_tool_trgm", {"working", "failed", "launching", "asking"}),
    ):
        tasks, _ = queries.filtered_tasks(queries.TaskFilterForm(filters, user=olga), olga)
        assert {task.pk for task in tasks} == {mixed[name].pk for name in found}
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_indexscan = off")
            plan = tasks.explain()
        assert f"Bitmap Index Scan on {index}" in plan, plan


def test_the_tasks_command_searches_like_the_page(mixed):
    def found(text: str) -> set[str]:
        out = StringIO()
        call_command("tasks", "--json", "--q", text, stdout=out)
        return {row["id"] for row in json.loads(out.getvalue())}

    assert found("cop") == {str(mixed["working"].pk), str(mixed["done"].pk)}  # the status message
    assert found("BACKUP") == {str(mixed["done"].pk)}  # the tool, which the status message does not name


def test_a_filter_value_that_does_not_fit_is_reported_and_left_out(client, olga, mixed):
    response = signed_in(client, olga).get(reverse("tasks:list"), {"server": "999999", "tool": "deploy"})
    assert response.status_code == 200
    assert "There is no server with that id" in response.content.decode()
    assert len(row_ids(response)) == 4  # the tool filter still applies
    response = client.get(reverse("tasks:list"), {"status": "bogus"})
    assert response.status_code == 200 and len(row_ids(response)) == 6


def test_the_list_is_paginated_and_the_pages_keep_the_filters(client, alpha, olga):
    with_tools(alpha, "bulk")
    tasks = [services.launch(server=alpha, tool="bulk", arguments={}, user=olga) for _ in range(PAGE_SIZE + 3)]
    client = signed_in(client, olga)
    first = client.get(reverse("tasks:list"), {"tool": "bulk"})
    assert len(row_ids(first)) == PAGE_SIZE
    assert row_ids(first)[0] == str(tasks[-1].pk)
    assert 'href="/tasks/?tool=bulk&amp;page=2"' in first.content.decode()
    second = client.get(reverse("tasks:list"), {"tool": "bulk", "page": 2})
    assert row_ids(second) == [str(task.pk) for task in reversed(tasks[:3])]
    assert "Page 2 of 2" in second.content.decode()
    assert "tasks 51\N{EN DASH}53 of 53" in second.content.decode()
    # the page count within a tab is that tab's count (launching is under Other)
    other = client.get(reverse("tasks:list"), {"tool": "bulk", "status": "other"})
    assert "Page 1 of 2 · tasks 1\N{EN DASH}50 of 53" in other.content.decode()
    assert len(row_ids(client.get(reverse("tasks:list"), {"tool": "bulk", "page": "zzz"}))) == PAGE_SIZE


def test_the_tabs_unfiltered_or_by_server_read_the_kept_counts_and_other_filters_count_tasks(
    client, olga, alpha, mixed
):
    # A row of changes no task stands behind: the tabs that show it read the counts the triggers keep.
    TaskStatusDelta.objects.create(server_id=alpha.pk, status="failed", delta=5)
    client = signed_in(client, olga)
    assert tab_counts(client.get(reverse("tasks:list")))["failed"] == 6
    assert tab_counts(client.get(reverse("tasks:list"), {"server": alpha.pk}))["failed"] == 5
    assert tab_counts(client.get(reverse("tasks:list"), {"tool": "deploy"}))["failed"] == 1
    TaskStatusDelta.objects.create(server_id=alpha.pk, status="working", delta=2)
    assert 'aria-label="running tasks">5</span>' in client.get(reverse("tasks:list"), {"tool": "x"}).content.decode()


def test_past_the_cap_a_filtered_list_says_so_rather_than_count_every_task(client, olga, mixed, monkeypatch):
    monkeypatch.setattr(queries, "COUNT_CAP", 3)
    monkeypatch.setattr(listing, "COUNT_CAP", 3)
    client = signed_in(client, olga)
    response = client.get(reverse("tasks:list"), {"tool": "deploy"})  # four tasks
    html = response.content.decode()
    assert '<span class="count">3+</span>' in html.split('data-tab="all"')[1].split("</a>")[0]
    assert tab_counts(response) == {}
    assert "More than 3 tasks match these filters" in html
    assert len(row_ids(response)) == 4
    # the tab asked for is counted on its own, exactly below the cap
    response = client.get(reverse("tasks:list"), {"tool": "deploy", "status": "failed"})
    assert tab_counts(response) == {"failed": 1} and row_ids(response) == [str(mixed["failed"].pk)]
    # below the cap every count is exact, and nothing is said
    response = client.get(reverse("tasks:list"), {"tool": "backup"})
    assert tab_counts(response)["all"] == 1 and tab_counts(response)["completed"] == 1
    assert "More than" not in response.content.decode()


def test_past_the_cap_the_pager_names_no_last_page(client, alpha, olga, monkeypatch):
    monkeypatch.setattr(queries, "COUNT_CAP", PAGE_SIZE + 1)
    monkeypatch.setattr(listing, "COUNT_CAP", PAGE_SIZE + 1)
    with_tools(alpha, "bulk")
    for _ in range(PAGE_SIZE + 3):
        services.launch(server=alpha, tool="bulk", arguments={}, user=olga)
    first = signed_in(client, olga).get(reverse("tasks:list"), {"tool": "bulk"}).content.decode()
    assert f"Page 1 · tasks 1\N{EN DASH}50 of more than {PAGE_SIZE + 1}" in first
    assert 'href="/tasks/?tool=bulk&amp;page=2"' in first


def test_the_list_escapes_status_messages_and_keeps_them_to_one_line(client, alpha, olga):
    durable(alpha, olga, statusMessage=XSS + "x" * 1000)
    html = signed_in(client, olga).get(reverse("tasks:list")).content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "x" * 500 not in html  # truncated in the cell and its title


def test_the_list_asks_the_same_queries_for_three_rows_as_for_thirty(client, alpha, olga):
    """Every column of a row is read by the list's one query (Task.objects.only(ROW_FIELDS) plus its joins): a field
    left out is fetched row by row (with progress bars that was 50 more queries on a page, and half its CPU)."""
    from taskhub.tasks.services.progress import record_progress

    def list_queries() -> int:
        with CaptureQueriesContext(connection) as asked:
            assert signed_in(client, olga).get(reverse("tasks:list")).status_code == 200
        return len(asked.captured_queries)

    def add_tasks(count: int) -> None:
        for n in range(count):
            task = durable(alpha, olga, statusMessage=f"step {n}")
            record_progress(task_id=task.pk, progress=n + 1, total=40, message=None)
        completed_with(alpha, olga, {"content": [{"type": "text", "text": "done"}]})

    add_tasks(2)
    list_queries()  # the first page a person opens also reads what later pages find cached
    few = list_queries()
    add_tasks(27)
    html = signed_in(client, olga).get(reverse("tasks:list")).content.decode()
    assert html.count("<progress") == 29 and "27 of 40" in html
    assert list_queries() == few


def test_an_htmx_request_gets_only_the_table_and_the_tabs(client, olga, mixed):
    response = signed_in(client, olga).get(reverse("tasks:list"), {"status": "working"}, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="task-results"')
    assert "<form" not in html and "<html" not in html
    assert row_ids(response) == [str(mixed["working"].pk)]


def test_empty_list_says_so(client, olga):
    html = signed_in(client, olga).get(reverse("tasks:list")).content.decode()
    assert "No tasks yet." in html


# --- detail ------------------------------------------------------------------------------------------


def test_taskhubs_own_words_are_labelled_as_taskhubs_and_the_servers_as_the_servers(client, alpha, olga):
    """Issue 34 item 5: a gated launch's message is taskhub's, not the server's; a message the server sends later is
    the server's again."""
    from taskhub.approvals.services import create_policy

    create_policy(server=alpha, tool="deploy", gate_before_call=True, user=None)
    gated = services.launch(server=with_tools(alpha, "deploy"), tool="deploy", arguments={"target": "x"}, user=olga)
    page = signed_in(client, olga).get(reverse("tasks:detail", args=[gated.pk])).content.decode()
    message = page.split(f'id="task-{gated.pk}-message"')[1].split("</section>")[0]
    assert "taskhub says:" in message and "waiting for approval before the call" in message
    assert "server says:" not in message

    task = durable(alpha, olga, status="working", statusMessage="warming up")
    Task.objects.filter(pk=task.pk).update(status_message_is_taskhubs=True)  # as if taskhub had spoken last
    services.apply_snapshot(task=task, snapshot=snapshot("working", task_id=task.remote_task_id, statusMessage="hot"))
    page = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    message = page.split(f'id="task-{task.pk}-message"')[1].split("</section>")[0]
    assert "server says:" in message and "hot" in message and "taskhub says:" not in message


def test_the_detail_shows_header_message_requests_facts_and_timeline(client, alpha, olga):
    task = durable(alpha, olga, status="input_required", statusMessage="need a <b>yes</b>", pollIntervalMs=5000)
    services.apply_snapshot(
        task=task,
        snapshot=snapshot(
            "input_required",
            task_id=task.remote_task_id,
            statusMessage="need a <b>yes</b>",
            pollIntervalMs=5000,
            inputRequests={
                "approve": {
                    "method": "elicitation/create",
                    "params": {
                        "message": "Deploy <i>now</i>?",
                        "requestedSchema": {"type": "object", "properties": {}},
                    },
                },
            },
        ),
    )
    html = signed_in(client, olga).get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert f'data-live-watch="{task.pk}"' in html
    assert "server says:" in html and "need a &lt;b&gt;yes&lt;/b&gt;" in html
    assert "Cancel task" in html
    requests = html.split(f'id="task-{task.pk}-requests"')[1].split(f'id="task-{task.pk}-no-requests"')[0]
    request = task.input_requests.get(key="approve")
    assert f'id="ir-{request.pk}"' in requests and "Deploy &lt;i&gt;now&lt;/i&gt;?" in requests  # the inbox's card
    assert f'data-open="{request.pk}"' in requests
    assert task.remote_task_id in html and "1 min" in html and "5 s" in html  # id, TTL, poll interval
    timeline = html.split(f'id="task-{task.pk}-timeline"')[1].split("</section>")[0]
    descriptions = re.findall(r"<strong>([^<]+)</strong>", timeline)
    assert descriptions == [
        "tool call launched",
        "server answered the tool call",
        "task status changed",
        "server asked for input",
    ]
    assert 'class="timeline-dot dot-input_required"' in timeline
    assert "&quot;to&quot;: &quot;input_required&quot;" in timeline


def test_an_approver_sees_the_detail_but_no_cancel_button(client, alpha, olga, amy):
    task = durable(alpha, olga)
    html = signed_in(client, amy).get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "Cancel task" not in html


def test_the_timeline_shows_the_latest_events_when_there_are_very_many(alpha, olga, monkeypatch):
    task = durable(alpha, olga)
    monkeypatch.setattr(presenters, "TIMELINE_CAP", 2)
    entries, earlier = presenters.timeline(task)
    assert [entry.action for entry in entries] == ["task.launched", "task.launch_answered"][-2:]
    assert earlier == AuditEvent.objects.filter(task_id=task.pk).count() - 2
    monkeypatch.setattr(presenters, "TIMELINE_CAP", AuditEvent.objects.filter(task_id=task.pk).count())
    assert presenters.timeline(task)[1] == 0  # exactly the cap: nothing earlier
    monkeypatch.setattr(presenters, "TIMELINE_CAP", 50)
    with CaptureQueriesContext(connection) as asked:
        entries, earlier = presenters.timeline(task)
    assert earlier == 0 and len(entries) < 50
    # The events alone: fewer than the cap are all there are (not counted), and its server logged nothing (none
    # asked for either).
    assert len(asked.captured_queries) == 1


# --- cancel ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        {"target": "prod", "count": 2, "nested": {"list": [1, 2.5, None, True], "名": "ü"}},
        [1, "1", 1.0],
        {"1": "x"},
        {1: "x"},  # the same JSON as the value before: indented the same
        {"when": datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC)},  # not JSON: as str
        "x" * (capped_text.PRETTY_KEPT_CHARS + 10),  # too long to keep: indented each time
        {"big": "y" * 100},
    ],
)
def test_pretty_json_is_json_indented_whether_kept_or_not(value):
    expected = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    for _ in range(2):  # written, then kept
        shown = capped_text.pretty_json(value, limit=50)
        assert (shown.text, shown.truncated, shown.total) == (expected[:50], len(expected) > 50, len(expected))
    circular = []
    circular.append(circular)
    assert capped_text.pretty_json(circular).text == repr(circular)


def test_an_operator_cancels_and_the_page_says_cancel_requested(client, alpha, olga):
    task = durable(alpha, olga)
    client = signed_in(client, olga)
    response = client.post(reverse("tasks:cancel", args=[task.pk]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("tasks:detail", args=[task.pk])
    html = response.content.decode()
    assert "Cancel requested" in html and "by olga" in html
    assert "Cancel task" not in html  # asked once is enough
    task.refresh_from_db()
    assert task.cancel_requested_by == olga
    assert AuditEvent.objects.filter(task_id=task.pk, action="task.cancel_requested").count() == 1


def test_a_task_that_completes_after_a_cancel_says_finished_anyway(client, alpha, olga):
    task = durable(alpha, olga)
    services.request_cancel(task=task, user=olga)
    services.apply_snapshot(task=task, snapshot=snapshot("completed", task_id=task.remote_task_id, result={}))
    html = signed_in(client, olga).get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "Finished anyway" in html and "Cancel requested" not in html


def test_a_cancel_the_server_was_told_of_while_it_still_reports_working_says_so_live(client, alpha, olga):
    task = durable(alpha, olga)
    services.request_cancel(task=task, user=olga)
    header = task_fragments.detail_status(Task.objects.get(pk=task.pk), olga).split("</header>")[0]
    assert "Cancel requested</strong> by olga" in header and "still reports" not in header  # not told yet

    services.mark_cancel_delivered(task=task)
    Task.objects.filter(pk=task.pk).update(cancel_requested_at=timezone.now() - datetime.timedelta(minutes=3))
    services.apply_snapshot(task=task, snapshot=snapshot(task_id=task.remote_task_id, statusMessage="still going"))
    task = Task.objects.get(pk=task.pk)
    header = task_fragments.detail_status(task, olga).split("</header>")[0]
    words = " ".join(re.sub(r"<[^>]+>", "", header).split())
    assert "Cancel requested 3 minutes ago; the server still reports working. olga asked;" in words

    # The same words on the page, until the task ends.
    html = signed_in(client, olga).get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "the server still reports working" in html
    services.apply_snapshot(task=task, snapshot=snapshot("cancelled", task_id=task.remote_task_id))
    html = signed_in(client, olga).get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "still reports working" not in html and "Cancelled as olga asked" in html


def test_htmx_cancel_gets_the_header_fragment(client, alpha, olga):
    task = durable(alpha, olga)
    response = signed_in(client, olga).post(reverse("tasks:cancel", args=[task.pk]), headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith(f'<header id="task-{task.pk}-header"')
    assert "Cancel requested" in html


def test_cancel_is_refused_to_an_approver_and_to_a_get(client, alpha, olga, amy):
    task = durable(alpha, olga)
    client = signed_in(client, amy)
    assert client.post(reverse("tasks:cancel", args=[task.pk])).status_code == 403
    assert client.get(reverse("tasks:cancel", args=[task.pk])).status_code == 405
    task.refresh_from_db()
    assert task.cancel_requested_at is None


def test_cancel_of_a_task_another_approver_cannot_see_is_404(client, alpha, olga, ben):
    task = durable(alpha, olga)
    assert signed_in(client, ben).post(reverse("tasks:cancel", args=[task.pk])).status_code == 404


def test_cancel_of_a_finished_task_says_why_and_changes_nothing(client, alpha, olga):
    task = durable(alpha, olga, status="completed", result={"content": []})
    events_before = AuditEvent.objects.count()
    client = signed_in(client, olga)
    response = client.post(reverse("tasks:cancel", args=[task.pk]), follow=True)
    assert "The task was not cancelled: The task is already completed" in response.content.decode()
    response = client.post(reverse("tasks:cancel", args=[task.pk]), headers={"HX-Request": "true"})
    assert 'role="alert">The task was not cancelled: The task is already completed' in response.content.decode()
    task.refresh_from_db()
    assert task.cancel_requested_at is None and AuditEvent.objects.count() == events_before


def test_cancel_of_a_launch_with_unknown_outcome_is_refused_with_the_reason(client, alpha, olga):
    task = services.launch(server=with_tools(alpha, "deploy"), tool="deploy", arguments={}, user=olga)
    services.mark_launch_unknown(task=task, reason="worker died")
    client = signed_in(client, olga)
    assert "Cancel task" not in client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    response = client.post(reverse("tasks:cancel", args=[task.pk]), follow=True)
    assert "no remote task to cancel" in response.content.decode()
    assert Task.objects.get(pk=task.pk).cancel_requested_at is None


# --- results, including hostile ones -----------------------------------------------------------------


def result_html(client, alpha, olga, result) -> str:
    task = completed_with(alpha, olga, result)
    html = signed_in(client, olga).get(reverse("tasks:detail", args=[task.pk])).content.decode()
    return html.split(f'id="task-{task.pk}-result"')[1].split("</section>")[0]


def test_text_is_shown_literally_and_capped(client, alpha, olga):
    html = result_html(
        client, alpha, olga, {"content": [{"type": "text", "text": XSS}, {"type": "text", "text": "y" * 50_000}]}
    )
    assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "y" * presenters.TEXT_CAP in html and "y" * (presenters.TEXT_CAP + 1) not in html
    assert f"Cut at {presenters.TEXT_CAP} of 50000 characters" in html


def test_raster_images_are_shown_and_svg_is_refused(client, alpha, olga):
    html = result_html(
        client,
        alpha,
        olga,
        {
            "content": [
                {"type": "image", "mimeType": "image/png", "data": PNG_1PX},
                {"type": "image", "mimeType": "image/svg+xml", "data": SVG},
                {"type": "image", "mimeType": "image/png", "data": "not base64!!"},
                {"type": "image", "mimeType": "image/png", "data": "A" * (presenters.IMAGE_CAP_BYTES * 2)},
            ]
        },
    )
    assert html.count("<img ") == 1
    assert f'src="data:image/png;base64,{PNG_1PX}"' in html
    assert "images of type image/svg+xml are not shown" in html
    assert SVG not in html
    assert "not valid base64" in html
    assert "larger than 2048 KiB" in html


def test_links_are_clickable_only_for_http_and_https(client, alpha, olga):
    html = result_html(
        client,
        alpha,
        olga,
        {
            "content": [
                {"type": "resource_link", "name": "report", "uri": "https://example.com/r?a=1&b=2"},
                {"type": "resource_link", "name": "evil", "uri": "javascript:alert(1)"},
                {"type": "resource_link", "name": "local", "uri": "file:///etc/passwd"},
            ]
        },
    )
    anchors = re.findall(r"<a [^>]*>", html)
    assert anchors == ['<a href="https://example.com/r?a=1&amp;b=2" rel="noopener noreferrer" target="_blank">']
    assert "javascript:alert(1)" in html and 'href="javascript' not in html
    assert "file:///etc/passwd" in html


def test_resources_audio_structured_content_and_is_error(client, alpha, olga):
    html = result_html(
        client,
        alpha,
        olga,
        {
            "isError": True,
            "content": [
                {"type": "resource", "resource": {"uri": "mem://notes", "mimeType": "text/plain", "text": "<b>n</b>"}},
                {"type": "resource", "resource": {"uri": "mem://blob", "mimeType": "application/zip", "blob": "AAAA"}},
                {"type": "audio", "mimeType": "audio/wav", "data": "AAAA"},
                {"type": "hologram", "beam": 1},
                "not even an object",
            ],
            "structuredContent": {"total": 3, "names": ["<a>", "b"]},
        },
    )
    assert "The tool reported an error" in html
    assert "&lt;b&gt;n&lt;/b&gt;" in html and "mem://notes" in html
    assert "Embedded binary resource" in html and "application/zip, 3" in html
    assert "Audio (audio/wav" in html and "not played here" in html
    assert "&quot;hologram&quot;" in html and "&quot;not even an object&quot;" in html
    assert "Structured content" in html and "&quot;names&quot;: [\n    &quot;&lt;a&gt;&quot;," in html


def test_odd_results_and_errors_do_not_break_the_page(client, alpha, olga):
    html = result_html(client, alpha, olga, {"content": "a string, not a list"})
    assert "a string, not a list" in html
    task = durable(alpha, olga, status="failed", error={"code": -32603, "message": XSS, "data": {"trace": [1, 2]}})
    html = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "Error -32603" in html and "&lt;script&gt;" in html and "<script>alert" not in html
    assert "&quot;trace&quot;" in html


# --- live fragments ----------------------------------------------------------------------------------


def test_the_list_signal_targets_body_with_no_swap_and_carries_the_row(alpha, olga):
    task = durable(alpha, olga)
    html = task_fragments.list_signal(task, olga)
    assert html.startswith(
        f'<template id="tasks-live-signal" hx-swap-oob="none:body" data-task="{task.pk}" data-status="working">'
    )
    assert html.endswith("</template>")
    # the row as the list renders it, for tasks.js to show before the re-fetch
    assert html.count("<tr ") == 1 and f'<tr id="task-row-{task.pk}" class="task-row row-working"' in html
    assert "hx-swap-oob" not in html.split(">", 1)[1]
    # an operator hears it through TASKS already; an approver through INBOX
    assert task_fragments.list_signal_for_approver(task, olga) == ""
    assert task_fragments.list_signal_for_approver(task, make_user("amy", APPROVERS)) == html


ROW_FACT_SHAPES = [
    ("working", None, None),
    ("completed", {"content": [{"type": "text", "text": "ok " + "é" * 300}]}, None),
    ("completed", {"content": [{"type": "text", "text": "no"}], "isError": True}, None),
    ("completed", {"content": [], "isError": "true"}, None),  # only JSON true is an error
    ("completed", {"content": "a string, not a list"}, None),
    ("completed", {"content": [{"type": "image", "data": "x"}, {"type": "text", "text": "second"}]}, None),
    ("completed", {"content": [{"type": "text", "text": 42}]}, None),
    ("completed", ["a list"], None),
    ("failed", None, {"code": -32603, "message": "boom"}),
    ("failed", None, {"code": "E" * 60, "kind": "not_approved"}),
    ("failed", None, {"code": None, "kind": True}),
    ("failed", None, {"code": 1.5, "kind": {"nested": [1, "two"]}}),
    ("failed", None, "an error that is a string"),
    ("cancelled", None, None),
    ("lost", None, None),
    ("expired", None, None),
    ("launch_unknown", None, None),
    ("input_required", None, None),
]


def test_the_row_facts_worked_out_in_python_are_the_list_querys(alpha, olga):
    # The live list signal works the row's facts out from the task it has (outcomes.with_row_facts_of); the list's
    # query annotates them in SQL (outcomes.with_row_facts): the same values for every shape of result and error.
    # The outcome settle_outcomes gives a row is the one the list's ?outcome= filter (SQL) puts it under.
    task = durable(alpha, olga)
    shapes = [
        *ROW_FACT_SHAPES,
        ("cancelled", None, {"kind": "not_approved"}),
        ("working", None, {"kind": "not_approved"}),
    ]
    for status, result, error in shapes:
        Task.objects.filter(pk=task.pk).update(status=status, result=result, error=error)
        annotated = outcomes.with_row_facts(Task.objects.filter(pk=task.pk)).get()
        worked_out = outcomes.with_row_facts_of(Task.objects.get(pk=task.pk))
        for fact in outcomes.ROW_FACTS:
            assert getattr(worked_out, fact) == getattr(annotated, fact), (status, result, error, fact)
            assert type(getattr(worked_out, fact)) is type(getattr(annotated, fact)), (status, result, error, fact)
        [outcome] = {row.outcome for row in outcomes.settle_outcomes([annotated, worked_out])}
        filtered_under = {
            value
            for value, _, _ in outcomes.OUTCOMES
            if Task.objects.filter(outcomes.outcome_filter(value), pk=task.pk).exists()
        }
        assert filtered_under == ({outcome} if outcome else set()), (status, result, error, outcome)


def test_the_detail_renderers_send_every_section_out_of_band_the_status_first(alpha, olga, ben):
    task = durable(alpha, olga, statusMessage=XSS)
    status, details = task_fragments.detail_status(task, olga), task_fragments.detail_sections(task, olga)
    for html, sections in (
        (status, ("header", "message")),
        (details, ("requests-signal", "result", "facts", "timeline")),
    ):
        for section in sections:
            assert re.search(rf'id="task-{task.pk}-{section}"[^>]*hx-swap-oob="true"', html), section
        assert html.count('hx-swap-oob="true"') == len(sections)
    # The requests section itself is never replaced live: someone may be typing an answer in it.
    assert f'id="task-{task.pk}-requests"' not in status + details
    assert "<script>alert" not in status + details and "Cancel task" in status
    # never for someone who may not see it
    assert task_fragments.detail_status(task, ben) == task_fragments.detail_sections(task, ben) == ""


def test_the_detail_resync_fragment_is_the_live_sections(client, alpha, olga):
    task = durable(alpha, olga)
    response = signed_in(client, olga).get(
        reverse("tasks:detail", args=[task.pk]), {"fragment": "live"}, headers={"HX-Request": "true"}
    )
    html = response.content.decode()
    assert "<html" not in html and html.count('hx-swap-oob="true"') == 6


@pytest.mark.django_db(transaction=True)
async def test_the_real_socket_carries_the_list_signal_and_the_detail_sections(alpha, olga):
    from channels.db import database_sync_to_async
    from channels.layers import get_channel_layer
    from django.db import connections

    import taskhub.asgi
    from tests.test_live import ORIGIN, _socket, session_cookie

    # Rebuilt now that the test settings allow the "testserver" host (the origin validator reads it once).
    application = importlib.reload(taskhub.asgi).application
    layer = get_channel_layer()
    await layer.flush()
    task = await sync_to_async(durable)(alpha, olga)
    communicator = _socket(application, await sync_to_async(session_cookie)(olga), ORIGIN)
    try:
        accepted, _ = await communicator.connect()
        assert accepted
        await communicator.receive_from(timeout=5)  # nav counts on connect
        await communicator.send_json_to({"watch": str(task.pk)})
        assert f'id="task-{task.pk}-header" class="task-header status-edge-working" hx-swap-oob="true"' in (
            await communicator.receive_from(timeout=5)
        )

        await database_sync_to_async(services.apply_snapshot)(
            task=task, snapshot=snapshot("working", task_id=task.remote_task_id, statusMessage="half <b>way</b>")
        )
        # The watched task's status first, in a frame of its own; then its other sections; then the list's signal
        # (and the nav counts).
        status = await communicator.receive_from(timeout=5)
        assert "half &lt;b&gt;way&lt;/b&gt;" in status and f'id="task-{task.pk}-message"' in status
        assert f'id="task-{task.pk}-header"' in status and f'id="task-{task.pk}-timeline"' not in status
        sections = await communicator.receive_from(timeout=5)
        assert f'id="task-{task.pk}-timeline"' in sections and f'id="task-{task.pk}-header"' not in sections
        assert 'id="tasks-live-signal"' not in status + sections
        html = await communicator.receive_from(timeout=5)
        assert f'<template id="tasks-live-signal" hx-swap-oob="none:body" data-task="{task.pk}"' in html
        assert html.count('id="tasks-live-signal"') == 1
        await communicator.disconnect()
    finally:
        await layer.flush()
        await database_sync_to_async(connections.close_all)()
        await sync_to_async(close_live_connections)()  # and the live pool's threads'


def test_a_live_change_of_a_task_that_asked_and_logged_nothing_asks_only_for_its_events(
    alpha, olga, django_assert_num_queries
):
    """The live socket reads the task with `asks` (consumer._task_or_none) and its log count: the detail's sections
    ask for the audit events alone, the inbox's signal and the list row's outcome for nothing."""
    from taskhub.live.access import connected_access, rendering_for
    from taskhub.live.consumer import _task_or_none
    from taskhub.live.fragments import FragmentKind, render_task_fragments
    from taskhub.tasks.live_inbox import inbox_fragment
    from taskhub.tasks.outcomes import settle_outcomes, with_row_facts_of

    task = durable(alpha, olga, status="completed")
    read = _task_or_none(task.pk)
    assert (read.asks, read.server_log_lines, read.progress_updates) == (False, 0, 0)
    with rendering_for(connected_access(olga)):
        with django_assert_num_queries(0):  # the status, sent first, asks for nothing
            status = "".join(render_task_fragments([FragmentKind.TASK_STATUS], read, olga, sharing=None))
        assert f'id="task-{task.pk}-header"' in status
        with django_assert_num_queries(1):
            sections = "".join(render_task_fragments([FragmentKind.TASK], read, olga, sharing=None))
        with django_assert_num_queries(0):
            assert inbox_fragment(read, olga) == ""
            assert settle_outcomes([with_row_facts_of(read)])[0].outcome == "completed"
    assert "task.launch_answered" in sections or "server answered the tool call" in sections
