"""Issue 15 items 1, 2 and 4 in a real browser: the signed-in home follows changes live and links to the lists it
counts; the task list tells outcomes apart, searches, reports a bad filter and switches times; Run again.
Fast checks of the same pages: tests/test_control_room.py.
"""

import re

import pytest
from playwright.sync_api import expect

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.mcp.client import ToolCompleted
from taskhub.servers.services import create_server, record_server_failure
from taskhub.tasks import services
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser.test_tasks import durable, live_site, snapshot, wait_until_live  # noqa: F401 (live_site)
from tests.browser_fixtures import PHONE, screenshot, sign_in
from tests.catalogue_fixtures import with_tools

pytestmark = pytest.mark.slow

ASK = {"method": "elicitation/create", "params": {"message": "Ship it?", "requestedSchema": {"type": "object"}}}
SCHEMA = {
    "type": "object",
    "properties": {"target": {"type": "string", "title": "Target"}, "replicas": {"type": "integer"}},
    "required": ["target"],
}


def completed(server, user, tool, result):
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments={}, user=user)
    return services.record_launch_outcome(task=task, outcome=ToolCompleted(result=result))


def test_the_home_counts_live_and_every_item_opens_its_list(live_site, new_page):  # noqa: F811
    olga = make_user("olga", OPERATORS, APPROVERS, password=TEST_PASSWORD)
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    beta = create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=None)
    record_server_failure(server=beta, error="connection refused")
    durable(alpha, olga, "deploy", "r-1", statusMessage="copying")
    completed(alpha, olga, "report", {"content": [{"type": "text", "text": "42 pages"}]})
    completed(alpha, olga, "render", {"content": [{"type": "text", "text": "no disk"}], "isError": True})
    failed = durable(alpha, olga, "migrate", "r-2")
    services.apply_snapshot(task=failed, snapshot=snapshot("r-2", "failed", error={"code": -32000, "message": "x"}))

    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/")
    wait_until_live(page)
    page.evaluate("window.__sameDocument = true")
    waiting = page.locator("#dash-waiting")
    expect(waiting).to_contain_text("Nothing waiting for you")
    expect(page.locator("#dash-mine")).to_contain_text("deploy")
    expect(page.locator("#dash-servers")).to_contain_text("beta")
    expect(page.locator("[data-outcome='completed_error'] .dash-count")).to_have_text("1")

    # a server asks a question: the home says so without a reload
    asking = durable(alpha, olga, "approve", "r-3")
    services.apply_snapshot(task=asking, snapshot=snapshot("r-3", "input_required", inputRequests={"go": ASK}))
    expect(waiting.locator(".dash-big")).to_have_text("1")
    expect(waiting).to_contain_text("The oldest was asked just now")
    assert page.evaluate("window.__sameDocument") is True
    # the trends (issue 34 deliver 3): each chart drawn, its numbers in a table, its links to the list
    hours = page.locator("#trend-24h")
    expect(hours.locator("svg.trend-svg rect.bar-completed_error")).to_have_count(1)
    expect(hours.locator("table.trend-table tbody tr")).to_have_count(24)
    expect(hours.locator("table.trend-table tbody tr").last).to_contain_text("1")
    expect(page.locator("#trend-7d table.trend-table tbody tr")).to_have_count(7)
    expect(page.locator("#trend-slowest tbody tr")).to_have_count(3)  # report, render, migrate
    screenshot(page, "home")

    # a chart's outcome opens the list of exactly those tasks
    hours.locator("[data-trend-outcome='failed'] a").click()
    expect(page).to_have_url(re.compile(r"/tasks/\?outcome=failed&ended=24h$"))
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator("tbody tr")).to_contain_text("migrate")
    page.go_back()
    wait_until_live(page)

    # an outcome's count opens the list of exactly those tasks
    page.locator("[data-outcome='completed_error'] a").click()
    expect(page).to_have_url(re.compile(r"/tasks/\?outcome=completed_error&ended=24h$"))
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator("tbody tr .outcome")).to_have_text("completed with error")

    narrow = page
    narrow.set_viewport_size(PHONE)
    narrow.goto(f"{live_site.url}/")
    expect(narrow.locator("#dash-outcomes")).to_be_visible()
    # the cards themselves fit (the nav is the responsive branch's)
    assert narrow.evaluate("document.querySelector('#dashboard').scrollWidth <= window.innerWidth")
    screenshot(narrow, "home-390")


def test_the_list_shows_outcomes_searches_reports_bad_filters_and_switches_times(live_site, new_page):  # noqa: F811
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    completed(alpha, olga, "report", {"content": [{"type": "text", "text": "42 pages written"}]})
    completed(alpha, olga, "render", {"content": [{"type": "text", "text": "the disk is full"}], "isError": True})
    failed = durable(alpha, olga, "migrate", "r-1")
    services.apply_snapshot(
        task=failed,
        snapshot=snapshot("r-1", "failed", statusMessage="schema locked", error={"code": -32000, "message": "x"}),
    )
    cancelled = durable(alpha, olga, "backup", "r-2")
    services.request_cancel(task=cancelled, user=olga)
    services.apply_snapshot(task=cancelled, snapshot=snapshot("r-2", "cancelled"))
    durable(alpha, olga, "deploy", "r-3", statusMessage="copying files")

    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/")
    outcomes = page.locator("tbody .task-outcome")
    expect(outcomes).to_have_text(["—", "cancelled by olga", "failed (-32000)", "completed with error", "completed"])
    expect(page.locator("tbody .result-preview").first).to_contain_text("the disk is full")
    screenshot(page, "tasks-list-outcomes")

    # search across results, from the filter bar; the filter stays in the URL
    page.get_by_label("Search").fill("DISK")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"/tasks/\?q=DISK$"))  # the empty filters stay out of the URL
    expect(page.locator("tbody tr")).to_have_count(1)

    # a value that does not fit says so, and the rest of the page still works
    page.goto(f"{live_site.url}/tasks/?status=bogus&tool=migr")
    expect(page.locator("#filter-errors")).to_contain_text("There is no status “bogus”")
    expect(page.locator("tbody tr")).to_have_count(1)
    screenshot(page, "tasks-list-bad-filter")

    # times: relative by default, exact at a click, and still exact on the next page
    page.goto(f"{live_site.url}/tasks/")
    started = page.locator("tbody tr").first.locator("time").first
    expect(started).to_have_text("just now")
    page.get_by_role("button", name="Exact times").click()
    expect(started).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
    page.reload()
    expect(page.locator("tbody tr").first.locator("time").first).to_have_text(re.compile(r"UTC$"))
    expect(page.get_by_role("button", name="Relative times")).to_have_attribute("aria-pressed", "true")

    narrow = page
    narrow.set_viewport_size(PHONE)
    narrow.goto(f"{live_site.url}/tasks/")
    assert narrow.evaluate("document.querySelector('.task-table').scrollWidth <= window.innerWidth")
    screenshot(narrow, "tasks-list-390")


def test_run_again_opens_the_launch_form_filled_in_and_launches(live_site, new_page):  # noqa: F811
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    with_tools(alpha, {"name": "deploy", "inputSchema": SCHEMA})
    first = services.launch(server=alpha, tool="deploy", arguments={"target": "prod-eu", "replicas": 3}, user=olga)

    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/{first.pk}/")
    screenshot(page, "task-detail-run-again")
    page.get_by_role("link", name="Run again").click()
    expect(page.locator("#run-again-notice")).to_be_visible()
    expect(page.get_by_label("Target")).to_have_value("prod-eu")
    expect(page.get_by_label("replicas")).to_have_value("3")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")  # as in docs/screenshots
    screenshot(page, "launch-run-again")
    page.get_by_label("Target").fill("prod-us")
    page.get_by_role("button", name="Launch").click()
    expect(page).to_have_url(re.compile(r"/tasks/[0-9a-f-]{36}/$"))
    assert str(first.pk) not in page.url
    expect(page.locator("pre, code").filter(has_text="prod-us").first).to_be_visible()
