"""Issue 4's acceptance in real processes: the demo MCP server, a `manage.py worker`, daphne, on Redis.

People act in the browser (Playwright on Debian's chromium), one browser context each; nothing on the
pages is reloaded by the test while it waits for a change, so every change seen arrived over the socket.
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest
from account_fixtures import TEST_PASSWORD, make_user
from browser_fixtures import needs_redis, screenshot, sign_in
from demo_process import DemoServer
from django.conf import settings
from django.contrib.auth.models import Group
from playwright.sync_api import Page, expect
from stack_fixtures import (
    LiveStack,
    Workers,
    in_own_thread,
    register_and_discover,
    session_cookie_for,
    worker_environment,
)

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.demo.scripts import MARKUP_PAYLOADS
from taskhub.tasks.models import InputRequest, Task

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TASK_URL = re.compile(r".*/tasks/([0-9a-f-]{36})/$")


@pytest.fixture
def people():
    return {
        "admin": make_user("ada", ADMINS, password=TEST_PASSWORD),
        "operator": make_user("olga", OPERATORS, password=TEST_PASSWORD),
        "approver": make_user("arun", APPROVERS, password=TEST_PASSWORD),
    }


@pytest.fixture(scope="module")
def stack_processes(session_daphne, live_channel_env, django_db_blocker):
    """The demo server (with the hostile tool) and one worker for the whole module, on the session's daphne and
    its Redis channel layer. Each test registers the server anew: its rows are flushed after it."""
    needs_redis(live_channel_env)
    with DemoServer("--hostile", "--poll-interval-ms", "200") as demo:
        with django_db_blocker.unblock():
            workers = Workers(worker_environment(**live_channel_env))
        try:
            workers.start(f"flows-{demo.port}")
            yield demo, workers
        finally:
            workers.stop_all()


@pytest.fixture
def stack(stack_processes, session_daphne, people):
    demo, workers = stack_processes
    server = register_and_discover(demo, people["admin"])
    return LiveStack(demo=demo, server=server, web=session_daphne, workers=workers)


def signed_in(new_page, stack: LiveStack, username: str, color_scheme: str = "light") -> Page:
    page = new_page(color_scheme)
    sign_in(page, stack.url, username, TEST_PASSWORD)
    expect(page.locator(".usermenu")).to_contain_text(username)
    return page


def wait_live(page: Page) -> None:
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")


def launch(page: Page, stack: LiveStack, tool: str, fill: dict[str, str] | None = None) -> str:
    """Launch `tool` through the generated form; returns the new task's id (the page lands on it)."""
    page.goto(f"{stack.url}/launch/")
    page.get_by_role("link", name=re.compile(rf"\b{re.escape(tool)}\b")).first.click()
    for label, value in (fill or {}).items():
        page.get_by_label(label, exact=False).fill(value)
    page.get_by_role("button", name="Launch", exact=True).click()
    expect(page).to_have_url(TASK_URL)
    return TASK_URL.match(page.url).group(1)


def wait_for_request(task_id: str, timeout: float = 15) -> float:
    """When the worker stored the server's question (monotonic time), polling the database."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if in_own_thread(InputRequest.objects.filter(task_id=task_id).exists):
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"the server's question for task {task_id} never arrived")


def card_for(page: Page, task_id: str):
    return page.locator(f"article.ir-card:has(a[href*='{task_id}'])")


@pytest.mark.embedded
def test_an_approval_from_launch_to_result_without_a_reload(new_page, stack, people):
    watcher = signed_in(new_page, stack, "olga")
    watcher.goto(f"{stack.url}/tasks/")
    wait_live(watcher)
    approver = signed_in(new_page, stack, "arun")
    approver.goto(f"{stack.url}/inbox/")
    wait_live(approver)

    operator = signed_in(new_page, stack, "olga")
    task_id = launch(operator, stack, "approval", {"action": "deploy to staging"})

    expect(watcher.locator(f"#task-row-{task_id}")).to_be_visible()
    asked_at = wait_for_request(task_id)
    card = card_for(approver, task_id)
    expect(card).to_be_visible(timeout=2_000)
    assert time.monotonic() - asked_at < 2.0  # in the approver's open inbox within 2 s of the question
    expect(card).to_contain_text("Approve deploy to staging?")
    screenshot(approver, "flow-inbox-approval")
    card.get_by_label("Approve?").check()
    card.get_by_label("Reason").fill("looks good")
    card.get_by_role("button", name="Accept").click()
    expect(card).to_contain_text(re.compile("answered by you|delivered"))

    expect(operator.locator(".pill").first).to_have_text("completed", timeout=15_000)
    expect(operator.get_by_text("approved: deploy to staging (reason: looks good)")).to_be_visible()
    expect(watcher.locator(f"#task-row-{task_id} .pill")).to_have_text("completed")
    screenshot(operator, "flow-detail-completed")
    screenshot(watcher, "flow-list")


def test_cancel_shows_requested_then_cancelled(new_page, stack):
    operator = signed_in(new_page, stack, "olga")
    task_id = launch(operator, stack, "long", {"seconds": "60"})
    wait_live(operator)
    expect(operator.locator(".pill").first).to_have_text("working", timeout=10_000)
    operator.get_by_role("button", name=re.compile("Cancel task")).click()
    expect(operator.get_by_text(re.compile("cancel requested", re.IGNORECASE)).first).to_be_visible()
    expect(operator.locator(".pill").first).to_have_text("cancelled", timeout=15_000)
    assert Task.objects.get(pk=task_id).status == "cancelled"


def test_url_mode_opens_nothing_before_the_click(new_page, stack):
    operator = signed_in(new_page, stack, "olga")
    approver = signed_in(new_page, stack, "arun")
    requested_hosts: list[str] = []
    approver.context.on("request", lambda request: requested_hosts.append(request.url))
    approver.context.route("https://example.com/**", lambda route: route.fulfill(body="authorized", status=200))
    approver.goto(f"{stack.url}/inbox/")
    wait_live(approver)

    task_id = launch(operator, stack, "url_consent")
    card = card_for(approver, task_id)
    expect(card).to_contain_text("https://example.com/authorize?task=")
    expect(card).to_contain_text("example.com")
    assert not [url for url in requested_hosts if "example.com" in url]
    link = card.get_by_role("link", name=re.compile("example.com"))
    assert link.get_attribute("rel") == "noopener noreferrer"
    screenshot(approver, "flow-inbox-url-mode")
    with approver.context.expect_page() as opened:
        link.click()
    opened.value.close()
    assert [url for url in requested_hosts if "example.com" in url]
    card.get_by_role("button", name="Accept").click()
    expect(operator.get_by_text("consented")).to_be_visible(timeout=15_000)


def test_two_questions_answered_one_after_the_other(new_page, stack):
    operator = signed_in(new_page, stack, "olga")
    approver = signed_in(new_page, stack, "arun")
    approver.goto(f"{stack.url}/inbox/")
    wait_live(approver)
    task_id = launch(operator, stack, "two_questions")
    cards = card_for(approver, task_id)
    expect(cards).to_have_count(2)

    name_card = cards.filter(has_text="What is your name?")
    name_card.get_by_label("Name").fill("Grace")
    name_card.get_by_role("button", name="Accept").click()
    expect(name_card).to_contain_text(re.compile("answered by you|delivered"))
    expect(operator.locator(".pill").first).to_have_text("needs input")

    color_card = cards.filter(has_text="Pick a color.")
    color_card.get_by_label("Color").select_option(label="Blue")
    color_card.get_by_role("button", name="Accept").click()
    expect(operator.get_by_text("name=Grace color=blue")).to_be_visible(timeout=15_000)


def test_an_approver_of_another_server_neither_sees_nor_answers(new_page, stack, people):
    reviewers = Group.objects.create(name="demo reviewers")
    stack.server.approver_groups.set([reviewers])
    people["approver"].groups.add(reviewers)
    make_user("otto", APPROVERS, password=TEST_PASSWORD)  # an approver, but not of this server

    operator = signed_in(new_page, stack, "olga")
    task_id = launch(operator, stack, "approval")
    allowed = signed_in(new_page, stack, "arun")
    allowed.goto(f"{stack.url}/inbox/")
    expect(card_for(allowed, task_id)).to_be_visible(timeout=10_000)

    outsider = signed_in(new_page, stack, "otto")
    outsider.goto(f"{stack.url}/inbox/")
    expect(outsider.get_by_text(re.compile("Nothing waiting for you", re.IGNORECASE))).to_be_visible()
    request = InputRequest.objects.get(task_id=task_id)
    csrf = next(c["value"] for c in outsider.context.cookies() if c["name"] == "csrftoken")
    forged = outsider.request.post(
        f"{stack.url}/inbox/{request.pk}/answer",
        form={"action": "accept", "approved": "true"},
        headers={"X-CSRFToken": csrf, "Referer": f"{stack.url}/inbox/"},
    )
    assert forged.status == 404  # as in the API: a request of a task otto may not see does not exist for him
    request.refresh_from_db()
    assert request.state == "open"


def test_markup_from_the_server_is_shown_as_text_and_never_runs(new_page, stack):
    operator = signed_in(new_page, stack, "olga")
    approver = signed_in(new_page, stack, "arun")
    pages = (operator, approver)

    operator.goto(f"{stack.url}/launch/")
    operator.get_by_role("link", name=re.compile("markup_probe")).first.click()
    expect(operator.get_by_text('Hostile fixture <img src=x onerror="window.__taskhub_xss=6">')).to_be_visible()
    operator.get_by_role("button", name="Launch", exact=True).click()
    expect(operator).to_have_url(TASK_URL)
    task_id = TASK_URL.match(operator.url).group(1)
    expect(operator.get_by_text(f"Working {MARKUP_PAYLOADS[0]}", exact=False).first).to_be_visible(timeout=10_000)

    approver.goto(f"{stack.url}/inbox/")
    card = card_for(approver, task_id)
    expect(card).to_contain_text(f"Server says {MARKUP_PAYLOADS[0]}")
    expect(card).to_contain_text(f"Pick {MARKUP_PAYLOADS[0]}")
    screenshot(approver, "flow-xss-inbox")
    card.get_by_role("button", name="Accept").click()
    expect(operator.get_by_text(f"done {MARKUP_PAYLOADS[0]}", exact=False).first).to_be_visible(timeout=15_000)
    screenshot(operator, "flow-xss-detail")

    operator.goto(f"{stack.url}/tasks/")
    for page in (*pages, operator):
        assert page.evaluate("window.__taskhub_xss") is None
        assert page.locator("img[src='x'], svg[onload]").count() == 0


def test_the_live_socket_refuses_strangers_and_foreign_origins(stack, people):
    socket_url = stack.url.replace("http://", "ws://") + "/ws/live/"
    cookie = session_cookie_for(people["operator"])

    async def handshake(origin: str, cookies: dict[str, str]) -> tuple[str, int | None]:
        async with aiohttp.ClientSession(cookies=cookies) as session:
            try:
                async with session.ws_connect(socket_url, origin=origin) as socket:
                    message = await socket.receive(timeout=5)
                    if message.type == aiohttp.WSMsgType.TEXT:
                        return "open", None
                    return "closed", socket.close_code
            except aiohttp.WSServerHandshakeError as error:
                return "refused", error.status

    def attempt(origin: str, cookies: dict[str, str]) -> tuple[str, int | None]:
        return in_own_thread(asyncio.run, main=handshake(origin, cookies))  # Playwright's loop runs in this thread

    signed_in_cookie = {settings.SESSION_COOKIE_NAME: cookie}
    assert attempt(stack.url, signed_in_cookie) == ("open", None)
    assert attempt("http://evil.example", signed_in_cookie) == ("refused", 403)
    # The consumer closes before accepting, which daphne turns into a refused handshake.
    assert attempt(stack.url, {}) == ("refused", 403)
