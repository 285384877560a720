"""Issue 16: twenty like requests answered in one submit, and the waiting count in the tab title with an opt-in
desktop notification; real processes: the demo MCP server, a `manage.py worker`, daphne on Redis, Chromium."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import SCREENSHOT_DIR, needs_redis, screenshot, sign_in
from tests.demo_process import DemoServer
from tests.helpers import wait_until
from tests.inbox_fixtures import request_of, task_asking
from tests.stack_fixtures import Workers, demo_stats, in_own_thread, register_and_discover, worker_environment

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LIKE = 20
# Records each desktop notification the page shows (the real Notification is still created).
RECORD_NOTIFICATIONS = """
window.__notices = [];
if ("Notification" in window) {
  const Real = window.Notification;
  const Recording = function (title, options) {
    window.__notices.push({ title: title, body: (options || {}).body || "" });
    return new Real(title, options);
  };
  Object.defineProperty(Recording, "permission", { get: () => Real.permission });
  Recording.requestPermission = (...args) => Real.requestPermission(...args);
  window.Notification = Recording;
}
"""


@pytest.fixture(scope="module")
def stack_processes(session_daphne, live_channel_env, django_db_blocker):
    needs_redis(live_channel_env)
    with DemoServer("--poll-interval-ms", "200") as demo:
        with django_db_blocker.unblock():
            workers = Workers(worker_environment(**live_channel_env))
        try:
            workers.start(f"like-{demo.port}")
            yield demo, workers
        finally:
            workers.stop_all()


def signed_in(page: Page, url: str, username: str) -> Page:
    sign_in(page, url, username, TEST_PASSWORD)
    expect(page.locator(".usermenu")).to_contain_text(username)
    return page


def launch_many(server, user, n: int) -> list[Task]:
    return [
        in_own_thread(services.launch, server=server, tool="approval", arguments={"action": "deploy"}, user=user)
        for _ in range(n)
    ]


def open_requests(tasks) -> int:
    return in_own_thread(
        InputRequest.objects.filter(task__in=[t.pk for t in tasks], state=InputRequestState.OPEN).count
    )


def test_twenty_like_requests_answered_in_one_submit(new_page, stack_processes, session_daphne):
    demo, _ = stack_processes
    admin = make_user("ada", ADMINS, password=TEST_PASSWORD)
    operator = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    make_user("arun", APPROVERS, password=TEST_PASSWORD)
    server = register_and_discover(demo, admin)
    url = session_daphne.url

    # Arun watches the task list in one tab, with desktop notifications allowed by the browser, and opts in.
    watcher = new_page(permissions=["notifications"])
    watcher.add_init_script(RECORD_NOTIFICATIONS)
    signed_in(watcher, url, "arun").goto(f"{url}/tasks/")
    expect(watcher.locator("#live-indicator")).to_have_attribute("data-state", "live")
    expect(watcher).to_have_title("Tasks · taskhub")
    notify_me = watcher.get_by_role("button", name="Notify me")
    notify_me.click()
    expect(watcher.locator("[data-notify-me]")).to_have_text("Notifications on")
    expect(watcher.locator("[data-notify-me]")).to_have_attribute("aria-pressed", "true")

    # Arun's inbox is open before the requests arrive: the group forms and grows live.
    inbox = signed_in(new_page(), url, "arun")
    inbox.goto(f"{url}/inbox/")
    expect(inbox.locator("#live-indicator")).to_have_attribute("data-state", "live")

    tasks = launch_many(server, operator, LIKE)
    wait_until(lambda: open_requests(tasks) == LIKE, what=f"{LIKE} open requests from the demo server")

    # The count arrived over the socket: the title and a desktop notification, without a reload.
    expect(watcher).to_have_title(f"({LIKE}) Tasks · taskhub", timeout=30_000)  # pushed: slow under load
    watcher.wait_for_function("window.__notices.length > 0")
    notices = watcher.evaluate("window.__notices")
    assert notices[0]["title"] == "taskhub inbox" and "wait" in notices[0]["body"]

    expect(inbox).to_have_title(f"({LIKE}) Inbox · taskhub")
    group = inbox.locator(".like-group")
    expect(group).to_have_count(1)
    expect(group.locator(".like-count")).to_have_text(str(LIKE))
    expect(group).to_contain_text("Approve deploy?")
    group.locator("summary").click()
    expect(group.locator("input[name=request]:checked")).to_have_count(LIKE)
    group.get_by_label("Approve?").check()
    group.get_by_label("Reason").fill("release train 42")
    screenshot(inbox, "inbox-like-requests")
    group.screenshot(path=SCREENSHOT_DIR / "inbox-like-group.png", caret="initial")
    group.get_by_role("button", name="Accept the ticked").click()

    expect(inbox.locator(".notice").first).to_contain_text(f"Accepted {LIKE} requests from {server.name}")
    expect(inbox.locator(".like-group")).to_have_count(0)
    screenshot(inbox, "inbox-like-requests-answered")

    # Twenty deliveries: the demo server received one tasks/update per request, and twenty audit rows.
    def delivered() -> dict[str, int] | None:
        remote = set(
            in_own_thread(
                lambda: list(Task.objects.filter(pk__in=[t.pk for t in tasks]).values_list("remote_task_id", flat=True))
            )
        )
        counts = demo_stats(demo)["deliveries"]
        ours = {key: n for key, n in counts.items() if key.split("/", 1)[0] in remote}
        return ours if len(ours) == LIKE else None

    deliveries = wait_until(delivered, what=f"{LIKE} deliveries at the demo server")
    assert set(deliveries.values()) == {1}
    answered = in_own_thread(
        lambda: list(
            AuditEvent.objects.filter(action="input.answered", task_id__in=[t.pk for t in tasks]).values_list(
                "task_id", "actor_label"
            )
        )
    )
    assert len(answered) == LIKE and {actor for _, actor in answered} == {"arun"}
    assert len({task for task, _ in answered}) == LIKE
    wait_until(
        lambda: in_own_thread(Task.objects.filter(pk__in=[t.pk for t in tasks], status="completed").count) == LIKE,
        what="every task to complete after its answer",
    )
    # And the title went down live on the watching tab.
    expect(watcher).to_have_title("Tasks · taskhub")


ASK = {
    "method": "elicitation/create",
    "params": {
        "message": "Rotate the API key of billing?",
        "requestedSchema": {"type": "object", "properties": {"why": {"type": "string", "title": "Why"}}},
    },
}


def test_a_request_answered_on_its_own_card_leaves_its_group_at_once(daphne_server, page):
    server = create_server(name="billing", transport="http", url="http://billing.example/mcp", user=None)
    make_user("arun", APPROVERS, password=TEST_PASSWORD)
    like = [request_of(task_asking(server, {"q": ASK}, tool="rotate"), "q") for _ in range(3)]
    signed_in(page, daphne_server.url, "arun").goto(f"{daphne_server.url}/inbox/")
    group = page.locator(".like-group")
    expect(group.locator(".like-count")).to_have_text("3")

    page.locator(f"#ir-{like[0].pk}").get_by_role("button", name="Decline").click()
    expect(page.locator(f"#ir-{like[0].pk}")).to_contain_text("answered by you")
    expect(group.locator(".like-count")).to_have_text("2")
    expect(group.locator("input[name=request]")).to_have_count(2)

    page.locator(f"#ir-{like[1].pk}").get_by_role("button", name="Decline").click()
    expect(page.locator(f"#ir-{like[1].pk}")).to_contain_text("answered by you")
    expect(group).to_have_count(0)  # one request left: its own card is enough
