"""The audit page in a real browser: filter, export CSV (under daphne), no JavaScript needed, the read-only admin."""

import csv
import io
import re
import threading

import pytest
from django.db import connections
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.audit.models import AuditEvent
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.audit_fixtures import make_audit_history
from tests.browser_fixtures import screenshot, sign_in

pytestmark = pytest.mark.slow


@pytest.fixture
def history(transactional_db):
    """Made in a thread of its own: Playwright keeps an event loop running in this one, which would make
    each live publish start a thread whose database connection outlives the test (and blocks dropping the
    test database); there the publish runs inline, and the connection is closed when done."""
    made = {}

    def make() -> None:
        try:
            admin = make_user("alex", ADMINS, password=TEST_PASSWORD)
            made.update(make_audit_history(admin, make_user("olga", OPERATORS)))
        finally:
            connections.close_all()

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    assert made, "the audit history could not be made (see the log above)"
    return made


def rows(page):
    return page.locator("table.audit-table tbody tr")


def test_an_admin_filters_by_action_and_downloads_exactly_that_as_csv(daphne_server, history, new_page):
    page = new_page()
    sign_in(page, daphne_server.url, "alex", TEST_PASSWORD)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Audit").click()
    expect(page).to_have_title("Audit · taskhub")
    expect(rows(page)).to_have_count(AuditEvent.objects.filter(actor__isnull=False).count())  # people's, at first
    page.get_by_role("link", name="Everything").click()  # taskhub's own too, one click away
    # The history's 12 and alex's sign-in (person.signed_in, method password)
    assert AuditEvent.objects.filter(action="person.signed_in", actor_label="alex").count() == 1
    expect(rows(page)).to_have_count(13)
    expect(page.get_by_role("status").filter(has_text="13 events")).to_be_visible()
    # A server's "<script>" in the data is text, and did not run.
    expect(page.locator("td.audit-details").filter(has_text="<script>document.title='pwned'</script>")).to_be_visible()
    screenshot(page, "audit-list")

    page.get_by_label("Action").select_option("task.launched")
    page.get_by_role("button", name="Filter").click()
    expect(rows(page)).to_have_count(3)
    expect(page).to_have_url(re.compile(r"/audit/\?.*action=task\.launched"))
    expect(page.locator(".audit-count")).to_contain_text("3 events match these filters")
    expect(page.locator("td.audit-action code")).to_have_text(["task.launched"] * 3)
    expect(page.get_by_label("Action")).to_have_value("task.launched")

    with page.expect_download() as download_info:
        page.get_by_role("link", name="CSV").click()
    download = download_info.value
    assert re.fullmatch(r"taskhub-audit-\d{8}T\d{6}Z\.csv", download.suggested_filename)
    with open(download.path(), encoding="utf-8", newline="") as file:
        exported = list(csv.DictReader(io.StringIO(file.read())))
    assert [row["action"] for row in exported] == ["task.launched"] * 3
    assert {row["actor_label"] for row in exported} == {"olga", "alex"}
    expected_ids = list(
        AuditEvent.objects.filter(action="task.launched").order_by("-time", "-id").values_list("id", flat=True)
    )
    assert [int(row["id"]) for row in exported] == expected_ids
    recorded = AuditEvent.objects.get(action="audit.exported")
    assert (recorded.actor_label, recorded.data["rows"], recorded.data["filters"]) == (
        "alex",
        3,
        {"made_by": "all", "action": "task.launched"},
    )
    assert page.title() == "Audit · taskhub"

    page.get_by_label("Task id").fill("not-a-task")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_text("“not-a-task” is not a task id")).to_be_visible()
    expect(rows(page)).to_have_count(0)
    screenshot(page, "audit-list-bad-filter")


def test_the_audit_page_in_dark_mode(daphne_server, history, new_page):
    page = new_page(color_scheme="dark")
    sign_in(page, daphne_server.url, "alex", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/audit/?made_by=all")
    expect(rows(page)).to_have_count(13)  # the history's 12 and alex's sign-in
    screenshot(page, "audit-list-dark")


def test_filtering_works_with_javascript_off(daphne_server, history, new_page):
    page = new_page(java_script_enabled=False)
    sign_in(page, daphne_server.url, "alex", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/audit/?made_by=system")
    page.get_by_label("Search").fill("Budget service")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"q=Budget\+service"))
    expect(rows(page)).to_have_count(1)
    expect(rows(page)).to_contain_text("task status changed")


def test_the_django_admin_shows_an_event_read_only(daphne_server, history, new_page):
    make_user("root", is_superuser=True, is_staff=True, password=TEST_PASSWORD)
    event = AuditEvent.objects.get(action="task.protocol_error")
    page = new_page()
    page.goto(f"{daphne_server.url}/admin/login/")
    page.get_by_label("Username").fill("root")
    page.get_by_label("Password").fill(TEST_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(f"{daphne_server.url}/admin/audit/auditevent/{event.id}/change/")
    expect(page.get_by_role("heading", name="View audit event")).to_be_visible()
    expect(page.get_by_role("button", name="Save")).to_have_count(0)
    expect(page.get_by_role("link", name="Delete")).to_have_count(0)
    screenshot(page, "audit-admin-change")
