"""Issue 15 item 3 in a real browser: a launch to a server that is down shows "attempt n of 9 · last error · next try"
live on the task page and in the list, and cancelling it ends it as cancelled, not sent. The launch job runs for
real (on a thread of its own: Playwright keeps a loop in this one). Fast checks: tests/test_launch_feedback.py.
"""

import pytest
from asgiref.sync import async_to_sync
from playwright.sync_api import expect

from taskhub.accounts.groups import OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import LAUNCH_ATTEMPTS, Task, TaskStatus
from taskhub.worker import jobs
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser.test_tasks import live_site, wait_until_live  # noqa: F401 (live_site)
from tests.browser_fixtures import SCREENSHOT_DIR, screenshot, sign_in
from tests.catalogue_fixtures import with_tools
from tests.helpers import free_port
from tests.stack_fixtures import in_own_thread

pytestmark = pytest.mark.slow


def launch_attempt(task_id, attempts_before: int) -> str:
    """One run of the launch job, as the worker's retry `attempts_before + 1` would run it."""
    try:
        return async_to_sync(jobs.launch)(task_id, last_attempt=False, attempts_before=attempts_before)
    except jobs.ServerUnreachable:
        return "will retry"


def test_a_retrying_launch_shows_its_attempts_live_and_a_cancel_ends_it_not_sent(live_site, new_page):  # noqa: F811
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    down = create_server(name="down", transport="http", url=f"http://127.0.0.1:{free_port()}/mcp", user=None)
    task = services.launch(server=with_tools(down, "quick"), tool="quick", arguments={"text": "hi"}, user=olga)

    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/{task.pk}/")
    wait_until_live(page)
    page.evaluate("window.__sameDocument = true")
    header = page.locator(f"#task-{task.pk}-header")
    expect(header.locator(".pill")).to_have_text("launching")
    expect(header.locator(".launch-retry")).to_have_count(0)

    assert in_own_thread(launch_attempt, task_id=task.pk, attempts_before=0) == "will retry"
    retry = header.locator(".launch-retry")
    expect(retry).to_contain_text(f"attempt 1 of {LAUNCH_ATTEMPTS} · last error:")
    assert in_own_thread(launch_attempt, task_id=task.pk, attempts_before=1) == "will retry"
    expect(retry).to_contain_text(f"attempt 2 of {LAUNCH_ATTEMPTS}")
    expect(retry).to_contain_text("last error:")
    expect(retry).to_contain_text("next try at")
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "task-launch-retrying")
    header.screenshot(path=SCREENSHOT_DIR / "task-launch-retrying-header.png")  # the README's

    listing = new_page()
    sign_in(listing, live_site.url, "olga", TEST_PASSWORD)
    listing.goto(f"{live_site.url}/tasks/")
    expect(listing.locator(f"#task-row-{task.pk} .launch-retry")).to_contain_text(f"attempt 2 of {LAUNCH_ATTEMPTS}")
    screenshot(listing, "task-list-launch-retrying")

    page.get_by_role("link", name="Cancel task…").click()  # the confirm step opens under the header
    page.get_by_role("button", name="Yes, cancel the task").click()
    expect(header.locator(".pill")).to_have_text("cancelled")
    expect(header).to_contain_text("Cancelled, not sent")
    expect(page.locator(f"#task-{task.pk}-message")).to_contain_text("The server has sent no status message.")
    expect(header.locator(".launch-retry")).to_have_count(0)
    # Live in the list too (a pushed change; 30 s: the list's re-render waits its turn on a loaded machine).
    expect(listing.locator(f"#task-row-{task.pk} .pill")).to_have_text("cancelled", timeout=30_000)
    screenshot(page, "task-cancelled-not-sent")

    # the retry that was due finds the task cancelled: no tools/call goes out
    assert in_own_thread(launch_attempt, task_id=task.pk, attempts_before=2) == "not launching"
    assert Task.objects.get(pk=task.pk).status == TaskStatus.CANCELLED
    assert not AuditEvent.objects.filter(task_id=task.pk, action="task.launch_sent").exists()
