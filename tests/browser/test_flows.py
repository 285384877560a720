"""Issue 4's acceptance in real processes: the demo MCP server, a `manage.py worker`, daphne, on Redis.

The flows that end in each outcome a tool can reach run against the demo server over HTTP and over stdio
(issue 13: without `--state`, so its tasks live only in the one process the worker keeps for the server).

People act in the browser (Playwright on Debian's chromium), one browser context each; nothing on the
pages is reloaded by the test while it waits for a change, so every change seen arrived over the socket.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import subprocess
import sys
import time

import aiohttp
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import Page, expect

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.approvals.services import create_policy
from taskhub.demo.scripts import MARKUP_PAYLOADS
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, Task
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.approval_fixtures import set_approver_groups
from tests.browser_fixtures import needs_redis, screenshot, sign_in
from tests.demo_process import DemoServer, stdio_target
from tests.helpers import wait_until
from tests.stack_fixtures import (
    LiveStack,
    Workers,
    demo_stats,
    in_own_thread,
    register_and_discover,
    session_cookie_for,
    worker_environment,
)

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
    """The demo server (with the hostile tool) and two workers for the whole module, on the session's daphne and
    its Redis channel layer. Each test registers the server anew: its rows are flushed after it."""
    needs_redis(live_channel_env)
    with DemoServer("--hostile", "--poll-interval-ms", "200") as demo:
        with django_db_blocker.unblock():
            workers = Workers(worker_environment(**live_channel_env))
        try:
            # Two workers: the flows hold whichever picks up a job; a stdio server's process runs in one of them
            # (tests/test_stdio_workers.py kills it).
            workers.start(f"flows-{demo.port}")
            workers.start(f"flows-{demo.port}-b")
            yield demo, workers
        finally:
            workers.stop_all()


@pytest.fixture
def transport() -> str:
    """How the stack's demo server is reached; the flows parametrized over it run over stdio too."""
    return "http"


BOTH_TRANSPORTS = pytest.mark.parametrize("transport", ["http", "stdio"])
# What the browser shows does not depend on the transport; these flows take one each, so both stay covered in the
# browser without paying every flow twice (the engine's paths per transport have tests of their own).
OVER_STDIO = pytest.mark.parametrize("transport", ["stdio"])


def register_over_stdio(admin) -> Server:
    """The demo server as a stdio server, without --state; the worker discovers it through its one process."""
    target = stdio_target("--hostile", "--poll-interval-ms", "200")
    server = in_own_thread(
        create_server,
        name="demo over stdio",
        transport="stdio",
        command=target.command,
        args=list(target.args),
        env=dict(target.env or {}),
        user=admin,
        discover_in_background=True,
    )
    wait_until(
        lambda: in_own_thread(Server.objects.filter(pk=server.pk, discovered_at__isnull=False).exists),
        timeout=60,
        what="the stdio server discovered by the worker",
    )
    server.refresh_from_db()
    return server


@pytest.fixture
def stack(stack_processes, session_daphne, people, transport):
    demo, workers = stack_processes
    if transport == "stdio":
        server = register_over_stdio(people["admin"])
    else:
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
    task = in_own_thread(
        Task.objects.values("status", "status_message", "launch_attempts", "launch_last_error").get, pk=task_id
    )
    raise AssertionError(
        f"the server's question for task {task_id} never arrived within {timeout:g} s; the task: {task}"
    )


def card_for(page: Page, task_id: str):
    return page.locator(f"article.ir-card:has(a[href*='{task_id}'])")


# On embedded Postgres too, over HTTP only: that pass is about the database; the transports differ in the worker.
@pytest.mark.parametrize("transport", [pytest.param("http", marks=pytest.mark.embedded), "stdio"])
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


@BOTH_TRANSPORTS
def test_cancel_shows_requested_then_cancelled(new_page, stack):
    operator = signed_in(new_page, stack, "olga")
    task_id = launch(operator, stack, "long", {"seconds": "60"})
    wait_live(operator)
    expect(operator.locator(".pill").first).to_have_text("working", timeout=10_000)
    operator.get_by_role("link", name="Cancel task…").click()  # a confirm step first
    expect(operator.get_by_role("button", name="Yes, cancel the task")).to_be_visible()
    screenshot(operator, "task-cancel-confirm")
    operator.get_by_role("button", name="Yes, cancel the task").click()
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
    # The launch and the first poll go through the workers, which a loaded machine (CI runs two test processes) can
    # hold up for more than an expectation's 10 s; the push from the stored question to the page is what is tested.
    wait_for_request(task_id, timeout=30)
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


@OVER_STDIO
def test_two_questions_answered_one_after_the_other(new_page, stack):
    operator = signed_in(new_page, stack, "olga")
    approver = signed_in(new_page, stack, "arun")
    approver.goto(f"{stack.url}/inbox/")
    wait_live(approver)
    task_id = launch(operator, stack, "two_questions")
    wait_for_request(task_id, timeout=30)
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


def test_a_failure_a_tool_error_and_a_question_before_the_task_end_as_the_server_says(new_page, stack):
    operator = signed_in(new_page, stack, "olga")
    failed = launch(operator, stack, "fail")
    wait_live(operator)
    expect(operator.locator(".pill").first).to_have_text("failed", timeout=15_000)
    expect(operator.get_by_text("Simulated failure").first).to_be_visible()

    tool_error = launch(operator, stack, "tool_error")
    wait_live(operator)
    expect(operator.get_by_text("Simulated tool error").first).to_be_visible(timeout=15_000)
    assert in_own_thread(Task.objects.get, pk=tool_error).result["isError"] is True

    # MRTR: the question comes before any task; the retry carries the answer (and the server's requestState,
    # which a stdio server knows only in the process that issued it).
    approver = signed_in(new_page, stack, "arun")
    approver.goto(f"{stack.url}/inbox/")
    wait_live(approver)
    mrtr = launch(operator, stack, "mrtr")
    card = card_for(approver, mrtr)
    expect(card).to_contain_text("What is your name?")
    card.get_by_label("Name").fill("Grace")
    card.get_by_role("button", name="Accept").click()
    expect(operator.get_by_text("hello, Grace").first).to_be_visible(timeout=15_000)
    outcomes = {task_id: in_own_thread(Task.objects.get, pk=task_id).status for task_id in (failed, tool_error, mrtr)}
    assert outcomes == {failed: "failed", tool_error: "completed", mrtr: "completed"}


def test_an_approver_of_another_server_neither_sees_nor_answers(new_page, stack, people):
    reviewers = Group.objects.create(name="demo reviewers")
    set_approver_groups(stack.server, [reviewers])
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
    card.locator("select").select_option("b")  # a required choice without default starts on none
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


def test_bulk_cancel_by_filter_shows_the_count_then_the_tasks_end_cancelled_live(new_page, stack, people):
    """Issue 15, item 5: filter, see the count (and what is skipped), confirm, watch the tasks end cancelled."""
    olga = people["operator"]

    def launch_directly(tool: str, arguments: dict) -> Task:
        return in_own_thread(services.launch, server=stack.server, tool=tool, arguments=arguments, user=olga)

    long_ones = [launch_directly("long", {"seconds": 60}) for _ in range(3)]
    finished = launch_directly("quick", {"text": "done already"})
    operator = signed_in(new_page, stack, "olga")
    operator.goto(f"{stack.url}/tasks/")
    wait_live(operator)
    expect(operator.locator("tr.row-working")).to_have_count(3, timeout=30_000)
    finished_row = operator.locator(f"#task-row-{finished.pk}")
    expect(finished_row).to_have_class(re.compile(r"\brow-completed\b"), timeout=30_000)

    # Ticked rows: one ticked is one to cancel.
    operator.locator(f"#task-row-{long_ones[0].pk} input[type=checkbox]").check()
    operator.get_by_role("button", name="Cancel ticked…").click()
    expect(operator.locator("#bulk-count")).to_have_attribute("data-count", "1")
    expect(operator.locator(".bulk-choice")).to_contain_text("Ticked in the list")
    operator.get_by_role("link", name="Keep them running").click()

    # By filter: the server's tasks; the finished one is skipped, and the page says so.
    operator.get_by_label("Server").select_option(label=stack.server.name)
    operator.get_by_role("button", name="Filter").click()
    operator.get_by_role("link", name="Cancel matching…").click()
    expect(operator.get_by_role("heading", level=1)).to_have_text("Cancel 3 tasks?")
    expect(operator.locator("#bulk-count")).to_have_attribute("data-count", "3")
    expect(operator.locator("#bulk-skipped")).to_have_text("1 already finished")
    expect(operator.locator(".bulk-sample tbody tr")).to_have_count(3)
    screenshot(operator, "bulk-cancel-confirm")
    operator.get_by_role("button", name="Cancel 3 tasks").click()

    message = operator.locator("[data-message]")
    expect(message).to_contain_text("Cancel requested for 3 tasks (skipped: 1 already finished)")
    wait_live(operator)
    operator.evaluate("window.__sameDocument = true")
    ids = [task.pk for task in long_ones]

    def states() -> list:
        rows = Task.objects.filter(pk__in=ids).order_by("created_at")
        return list(rows.values_list("status", "cancel_requested_at", "cancel_delivered_at"))

    # The server's word first (a failure here says how far each cancel got), then the page's, live.
    wait_until(lambda: all(state[0] == "cancelled" for state in states()), what=f"cancelled: {states()}", timeout=60)
    for task in long_ones:
        expect(operator.locator(f"#task-row-{task.pk} .pill")).to_have_text("cancelled", timeout=30_000)
    assert operator.evaluate("window.__sameDocument") is True  # seen live, not reloaded
    screenshot(operator, "bulk-cancel-done")
    assert {Task.objects.get(pk=task.pk).status for task in long_ones} == {"cancelled"}
    assert Task.objects.get(pk=finished.pk).status == "completed"


# --- approval policies (issue 16) ------------------------------------------------------------------------------


def deliveries_of(stack: LiveStack, task_id: str) -> int:
    """tasks/update calls the demo server received for the task (its own counters)."""
    remote = in_own_thread(lambda: Task.objects.get(pk=task_id).remote_task_id)
    return sum(n for key, n in demo_stats(stack.demo)["deliveries"].items() if key.startswith(f"{remote}/"))


def approvers_group() -> Group:
    return Group.objects.get(name=APPROVERS)


def accept_approval(page: Page, task_id: str):
    card = card_for(page, task_id)
    expect(card).to_be_visible(timeout=15_000)
    card.get_by_label("Approve?").check()
    card.get_by_label("Reason").fill("ok")
    card.get_by_role("button", name="Accept").click()
    return card


def test_two_of_three_sends_one_answer_only_after_the_second_acceptance(new_page, stack, people):
    for name in ("bea", "cal"):
        in_own_thread(make_user, username=name, password=TEST_PASSWORD)
        in_own_thread(lambda name=name: get_user_model().objects.get(username=name).groups.add(approvers_group()))
    in_own_thread(
        lambda: create_policy(
            server=stack.server,
            tool="approval",
            users=list(get_user_model().objects.filter(username__in=["arun", "bea", "cal"])),
            required_accepts=2,
            user=None,
        )
    )
    operator = signed_in(new_page, stack, "olga")
    task_id = launch(operator, stack, "approval", {"action": "deploy to prod"})
    wait_for_request(task_id)

    first = signed_in(new_page, stack, "arun")
    first.goto(f"{stack.url}/inbox/")
    expect(card_for(first, task_id)).to_contain_text("for: arun, bea, cal")
    card = accept_approval(first, task_id)
    expect(card.locator(".ir-acceptances")).to_contain_text("1 of 2 accepted: arun")
    assert deliveries_of(stack, task_id) == 0
    assert in_own_thread(lambda: InputRequest.objects.get(task_id=task_id).state) == "open"

    second = signed_in(new_page, stack, "bea")
    second.goto(f"{stack.url}/inbox/")
    expect(card_for(second, task_id).locator(".ir-acceptances")).to_contain_text("1 of 2 accepted: arun")
    screenshot(second, "approval-two-of-three")
    card = accept_approval(second, task_id)
    expect(card).to_contain_text(re.compile("answered by you|delivered"))
    expect(operator.locator(".pill").first).to_have_text("completed", timeout=15_000)
    assert deliveries_of(stack, task_id) == 1


def test_the_launcher_is_not_offered_a_form_for_their_own_task(new_page, stack, people):
    """Issue 34 item 4: where the policy refuses self-approval, the launcher's card says so instead of a form that
    would be refused once filled in."""
    in_own_thread(lambda: make_user("dana", OPERATORS, APPROVERS, password=TEST_PASSWORD))
    in_own_thread(lambda: create_policy(server=stack.server, tool="approval", user=None))
    launcher = signed_in(new_page, stack, "dana")
    task_id = launch(launcher, stack, "approval", {"action": "grant myself access"})
    wait_for_request(task_id)
    launcher.goto(f"{stack.url}/inbox/")
    card = card_for(launcher, task_id)
    expect(card.locator(".ir-barred")).to_contain_text("You launched this task")
    expect(card.locator(".ir-barred")).to_contain_text("does not allow self-approval")
    expect(card.get_by_role("button", name="Accept")).to_have_count(0)
    assert in_own_thread(lambda: InputRequest.objects.get(task_id=task_id).state) == "open"
    assert deliveries_of(stack, task_id) == 0


def test_a_gated_launch_reaches_the_server_only_after_its_approval(new_page, stack, people):
    in_own_thread(lambda: create_policy(server=stack.server, tool="approval", gate_before_call=True, user=None))
    calls_before = demo_stats(stack.demo)["calls"].get("approval", 0)
    operator = signed_in(new_page, stack, "olga")
    approved = launch(operator, stack, "approval", {"action": "rotate keys"})
    declined = launch(operator, stack, "approval", {"action": "drop the database"})

    approver = signed_in(new_page, stack, "arun")
    approver.goto(f"{stack.url}/inbox/")
    for task_id in (approved, declined):
        expect(card_for(approver, task_id).locator(".ir-gate-arguments")).to_contain_text(
            '"action": "rotate keys"' if task_id == approved else '"action": "drop the database"'
        )
    assert demo_stats(stack.demo)["calls"].get("approval", 0) == calls_before  # nothing sent before an approval
    screenshot(approver, "approval-gate")
    admin = signed_in(new_page, stack, "ada")
    admin.goto(f"{stack.url}/approvals/")
    expect(admin.locator(".policies-table")).to_contain_text("needs approval")
    screenshot(admin, "approval-policies")

    card_for(approver, declined).get_by_role("button", name="Decline").click()
    expect(card_for(approver, declined)).to_contain_text("answered by you")
    card_for(approver, approved).get_by_role("button", name="Accept").click()
    wait_until(
        lambda: in_own_thread(InputRequest.objects.filter(task_id=approved, method="elicitation/create").exists),
        what="the server's question after the approved launch",
    )
    assert demo_stats(stack.demo)["calls"]["approval"] == calls_before + 1
    task = in_own_thread(lambda: Task.objects.get(pk=declined))
    assert task.status == "failed" and task.status_message == "not approved: declined by arun"
    assert task.remote_task_id is None
    operator.goto(f"{stack.url}/tasks/{declined}/")  # taskhub's own words, not labelled as the server's
    expect(operator.locator(".from-taskhub")).to_have_text("taskhub says: not approved: declined by arun")
    expect(operator.locator(".from-server")).to_have_count(0)


def test_a_deadline_passes_and_the_default_is_sent_and_audited(new_page, stack, people):
    fixed = {"action": "accept", "content": {"approved": False, "reason": "no answer in time"}}
    policy = in_own_thread(
        lambda: create_policy(
            server=stack.server,
            tool="approval",
            answer_within=datetime.timedelta(seconds=4),
            at_deadline="answer",
            deadline_answer=fixed,
            user=None,
        )
    )
    # The approver's inbox is open before the question arrives: its card comes in live, with the time left.
    approver = signed_in(new_page, stack, "arun")
    approver.goto(f"{stack.url}/inbox/")
    wait_live(approver)
    operator = signed_in(new_page, stack, "olga")
    task_id = launch(operator, stack, "approval", {"action": "ship it"})
    card = card_for(approver, task_id)
    expect(card.locator(".ir-deadline")).to_contain_text(re.compile(r"answer within [1-4] s"), timeout=15_000)
    screenshot(approver, "approval-deadline")

    # Nobody answers: the worker's deadline job sends the fixed answer, which the server applies.
    expect(card).to_contain_text("answered by taskhub, at the deadline", timeout=15_000)
    wait_until(lambda: deliveries_of(stack, task_id) == 1, timeout=15, what="the default delivered to the server")
    operator.goto(f"{stack.url}/tasks/{task_id}/")
    expect(operator.locator(".pill").first).to_have_text("completed", timeout=15_000)
    expect(operator.locator("body")).to_contain_text("rejected: ship it (reason: no answer in time)")
    applied = operator.locator(".timeline-entry", has_text="applied the approval policy's default")
    expect(applied).to_contain_text(re.compile(rf'"policy": ?{policy.pk}\b'))
    expect(applied).to_contain_text('"outcome": "answered"')
    expect(applied).to_contain_text("by system")
    assert deliveries_of(stack, task_id) == 1


def test_an_admin_adds_a_webhook_and_a_gated_launch_reaches_it_signed(new_page, stack, people):
    from taskhub.approvals.models import ApprovalPolicy, DeliveryStatus, WebhookDelivery
    from tests.webhook_receiver import WebhookReceiver

    policy = in_own_thread(
        lambda: create_policy(server=stack.server, tool="approval", gate_before_call=True, user=None)
    )
    receiver = WebhookReceiver(secret="flows-webhook-secret").start()
    try:
        admin = signed_in(new_page, stack, "ada")
        admin.goto(f"{stack.url}/approvals/{policy.pk}/edit/")
        admin.get_by_label("URL").fill(receiver.url)
        admin.get_by_label("Secret").fill("flows-webhook-secret")
        admin.get_by_role("button", name="Add the webhook").click()
        expect(admin.locator(".notice")).to_contain_text("The webhook is added.")
        expect(admin.locator(".webhooks-table")).to_contain_text(receiver.url)
        expect(admin.locator(".webhooks-table")).to_contain_text("set")
        assert "flows-webhook-secret" not in admin.content()

        operator = signed_in(new_page, stack, "olga")
        task_id = launch(operator, stack, "approval", {"action": "rotate keys"})
        # The web process queued the delivery when the gate opened; a worker process sends it.
        wait_until(lambda: receiver.received, what="the webhook delivery", timeout=20)
        delivery = receiver.received[0]
        assert delivery.signature_ok and delivery.headers["x-taskhub-event"] == "request.waiting"
        assert (delivery.json["task_id"], delivery.json["tool"]) == (task_id, "approval")
        # The worker records the delivery once the receiver has answered, a moment after it was received; the page
        # refreshes its table only every 10 s, as long as an expectation waits: look once it is recorded.
        wait_until(
            lambda: in_own_thread(lambda: WebhookDelivery.objects.filter(status=DeliveryStatus.DELIVERED).exists()),
            what="the delivery recorded as delivered",
            timeout=20,
        )

        admin.goto(f"{stack.url}/approvals/{policy.pk}/edit/")
        row = admin.locator(".deliveries-table tbody tr").first
        expect(row).to_contain_text("delivered")
        expect(row).to_contain_text("HTTP 200")
        admin.evaluate("window.scrollTo(0, 0)")  # a scrolled page pins the sticky top bar mid-picture
        screenshot(admin, "approval-webhooks")
        assert in_own_thread(lambda: ApprovalPolicy.objects.get(pk=policy.pk).webhooks.count()) == 1
    finally:
        receiver.stop()


# --- the MCP gateway (issue 17) -------------------------------------------------------------------------------


def test_an_agents_call_through_the_gateway_waits_for_an_approver_in_the_browser(new_page, stack, people):
    """The issue's end to end: `python -m taskhub.mcp call --url <taskhub>/mcp --bearer TOKEN <server>__approval`
    starts a task; the policy's approver answers its question in the inbox; the CLI ends completed; the task page
    and the audit trail name the agent (the token) and the approver."""
    from taskhub.api.tokens import create_token
    from taskhub.audit.models import AuditEvent

    in_own_thread(lambda: create_policy(server=stack.server, tool="approval", user=None))
    token, secret = in_own_thread(lambda: create_token(user=people["operator"], name="release pipeline"))
    command = [
        sys.executable, "-m", "taskhub.mcp", "call", "--url", f"{stack.url}/mcp", "--bearer", secret,
        f"{stack.server.name}__approval", "--args", '{"action": "deploy to prod"}',
    ]  # fmt: skip
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        task_id = str(
            wait_until(
                lambda: in_own_thread(
                    lambda: Task.objects.filter(launched_via_token=token).values_list("pk", flat=True).first()
                ),
                what="the agent's call to become a task",
                timeout=30,
            )
        )
        wait_for_request(task_id, timeout=30)
        approver = signed_in(new_page, stack, "arun")
        approver.goto(f"{stack.url}/inbox/")
        expect(card_for(approver, task_id)).to_contain_text("deploy to prod")
        card = accept_approval(approver, task_id)
        expect(card).to_contain_text(re.compile("answered by you|delivered"))
        output, _ = cli.communicate(timeout=90)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, output
    assert "completed" in output and "approved: deploy to prod" in output, output

    operator = signed_in(new_page, stack, "olga")
    operator.goto(f"{stack.url}/tasks/{task_id}/")
    expect(operator.locator(".pill").first).to_have_text("completed")
    expect(operator.locator("main")).to_contain_text("via release pipeline")
    operator.evaluate("window.scrollTo(0, 0)")
    screenshot(operator, "gateway-task")
    launched = in_own_thread(lambda: AuditEvent.objects.get(task_id=task_id, action="task.launched"))
    answered = in_own_thread(
        lambda: AuditEvent.objects.select_related("actor").get(task_id=task_id, action="input.answered")
    )
    assert launched.actor_label == "olga" and launched.data["agent"]["token_id"] == token.pk
    assert answered.actor.username == "arun" and "agent" not in answered.data
