"""Live changes said politely to screen readers, the focus left where the person is (issue 35 item 3).

A new request on the inbox and a task's end on its page are written into an `aria-live="polite"` region, which a
screen reader reads when it is idle; what had the focus keeps it. The changes are made through the services in this
process and reach the browser over the socket (tests/browser/test_tasks.py's live_site), nothing reloaded.
"""

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.servers.services import create_server
from taskhub.tasks import services
from tests import helpers
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.approval_fixtures import add_approver_groups
from tests.browser.test_tasks import durable, live_site, snapshot, wait_until_live  # noqa: F401 (live_site)
from tests.browser_fixtures import sign_in
from tests.inbox_fixtures import remote_id, request_of, task_asking

pytestmark = pytest.mark.slow

ASK = {
    "method": "elicitation/create",
    "params": {
        "message": "Deploy build 4127 to production?",
        "requestedSchema": {"type": "object", "properties": {"reason": {"type": "string", "title": "Reason"}}},
    },
}
FOCUSED = "document.activeElement && document.activeElement.id"


def test_a_new_request_is_announced_on_the_inbox_without_taking_the_focus(live_site, new_page):  # noqa: F811
    server = create_server(name="billing", transport="http", url="http://billing.example/mcp", user=None)
    add_approver_groups(server, Group.objects.create(name="finance"))
    make_user("ada", APPROVERS, "finance", password=TEST_PASSWORD)
    first = request_of(task_asking(server, {"approve": ASK}, tool="deploy_1"), "approve")
    page = new_page()
    sign_in(page, live_site.url, "ada", TEST_PASSWORD)
    page.goto(f"{live_site.url}/inbox/")
    wait_until_live(page)
    region = page.locator("#inbox-announce")
    expect(region).to_have_attribute("aria-live", "polite")
    expect(region).to_have_text("")
    # The person is typing an answer in the first card when the second request arrives.
    reason = page.locator(f"#ir-{first.pk}").get_by_label("Reason")
    reason.focus()
    page.keyboard.type("half a sent")
    focused = page.evaluate(FOCUSED)

    second = request_of(task_asking(server, {"approve": ASK}, tool="deploy_2"), "approve")
    expect(page.locator(f"#ir-{second.pk}")).to_be_visible()
    expect(region).to_have_text("A new request arrived.")
    assert page.evaluate(FOCUSED) == focused
    expect(reason).to_be_focused()
    expect(reason).to_have_value("half a sent")


def test_a_tasks_end_is_announced_on_its_page_without_taking_the_focus(live_site, new_page):  # noqa: F811
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    task = durable(alpha, olga, "deploy", "r-1", statusMessage="copying files (1/3)", pollIntervalMs=2000)
    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/{task.pk}/")
    wait_until_live(page)
    region = page.locator("#task-end-status")
    expect(region).to_have_attribute("aria-live", "polite")
    # The person is on the task's copy button, in the header the socket replaces at every change.
    copy = page.locator(f"#task-{task.pk}-header button.copy")
    copy.focus()

    # A change that is not the end is shown, not announced.
    services.apply_snapshot(task=task, snapshot=snapshot("r-1", statusMessage="copying files (2/3)"))
    expect(page.locator(f"#task-{task.pk}-message")).to_contain_text("copying files (2/3)")
    expect(region).to_have_text("")
    expect(copy).to_be_focused()

    services.apply_snapshot(task=task, snapshot=snapshot("r-1", "failed", statusMessage="disk full"))
    expect(page.locator(f"#task-{task.pk}-header .pill").first).to_have_text("failed")
    expect(region).to_have_text("The task ended: failed.")
    expect(copy).to_be_focused()


def test_a_card_replaced_live_keeps_the_keyboard_on_the_link_it_was_on(live_site, new_page):  # noqa: F811
    """A card the socket replaces (its task ended while the person was on it) gives the focus back to the same control
    in the new card (static/taskhub/live.js: the same id, else the same link or button), not to the card as a whole: a
    keyboard user on the card's "open the task" link is still on it."""
    server = create_server(name="billing", transport="http", url="http://billing.example/mcp", user=None)
    add_approver_groups(server, Group.objects.create(name="finance"))
    make_user("ada", APPROVERS, "finance", password=TEST_PASSWORD)
    task = task_asking(server, {"approve": ASK}, tool="deploy_1")
    asked = request_of(task, "approve")
    page = new_page()
    sign_in(page, live_site.url, "ada", TEST_PASSWORD)
    page.goto(f"{live_site.url}/inbox/")
    wait_until_live(page)
    card = page.locator(f"#ir-{asked.pk}")
    open_task = card.locator(f'a[href="/tasks/{task.pk}/"]')
    open_task.focus()

    services.apply_snapshot(task=task, snapshot=helpers.snapshot("failed", task_id=remote_id(task)))
    expect(card).to_have_attribute("data-state", "ended")
    expect(open_task).to_be_focused()
