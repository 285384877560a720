"""The task list and the task detail in a real browser, following changes made through the services live.

daphne runs in a subprocess; the changes are made in this process, so both use one Redis channel layer
(with a prefix of this run's, so other runs on the same Redis do not hear these messages).
"""

import base64
import datetime
import re
import struct
import zlib

import pytest
from channels_redis.core import RedisChannelLayer
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from taskhub.accounts.groups import AGENTS, APPROVERS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.live import publish
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.services import create_server
from taskhub.settings import channel_layers_from_env
from taskhub.tasks import services
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.approval_fixtures import set_approver_groups
from tests.browser_fixtures import needs_redis, screenshot, sign_in
from tests.catalogue_fixtures import with_tools

pytestmark = pytest.mark.slow


def png(width: int = 240, height: int = 80) -> str:
    """A small real PNG (a blue-to-green gradient), base64, as a tool would return it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(
        b"\x00" + b"".join(bytes((40, 90 + 120 * x // width, 200 - 120 * x // width)) for x in range(width))
        for _ in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(data).decode()


CREATED = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
HOSTILE = '<img src=x onerror="window.__xss = 1">'
COUNT_INBOX_PUSHES = """() => {
  window.__inboxPushes = 0;
  document.addEventListener("htmx:wsAfterMessage", (event) => {
    if (String(event.detail.message).includes("inbox-live-signal")) window.__inboxPushes += 1;
  });
}"""
ASK = {"method": "elicitation/create", "params": {"message": "Ship it?", "requestedSchema": {"type": "object"}}}


def snapshot(remote_id: str, status: str = "working", **fields) -> TaskSnapshot:
    base = {"taskId": remote_id, "status": status, "createdAt": CREATED, "ttlMs": 3_600_000}
    return TaskSnapshot.model_validate({**base, **fields})


@pytest.fixture
def live_site(daphne_server, live_channel_env, monkeypatch):
    """daphne and this test process on one Redis channel layer, so a service call here reaches the browser."""
    needs_redis(live_channel_env)
    with monkeypatch.context() as env:
        for name, value in live_channel_env.items():
            env.setenv(name, value)
        # Built by the settings' own function, so this process and daphne agree on hosts and prefix.
        layer = RedisChannelLayer(**channel_layers_from_env()["default"]["CONFIG"])
    monkeypatch.setattr(publish, "get_channel_layer", lambda: layer)
    yield daphne_server
    publish.close_layer_connections(layer)


def durable(server, user, tool: str, remote_id: str, **fields):
    with_tools(server, tool)
    task = services.launch(server=server, tool=tool, arguments={"target": "prod", "dry_run": False}, user=user)
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(remote_id, **fields)))


def wait_until_live(page):
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")


def test_the_list_follows_changes_and_new_tasks_without_a_reload(live_site, new_page, console_errors):
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    beta = create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=None)
    first = durable(alpha, olga, "deploy", "r-1", statusMessage="copying files (1/3)")
    durable(beta, olga, "backup", "r-2", statusMessage="snapshotting volumes")
    done = durable(alpha, olga, "report", "r-3")
    services.apply_snapshot(
        task=done, snapshot=snapshot("r-3", "completed", result={"content": [{"type": "text", "text": "ok"}]})
    )

    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/")
    wait_until_live(page)
    page.evaluate("window.__sameDocument = true")
    row = page.locator(f"#task-row-{first.pk}")
    expect(row).to_contain_text("copying files (1/3)")
    expect(page.locator("[data-tab='all'] .count")).to_have_text("3")

    # a change made through the services: the row updates in place, highlighted, and is announced politely (a
    # live region screen readers read when they are idle) without taking the focus from where the person is
    expect(page.locator("#task-live-status")).to_have_attribute("aria-live", "polite")
    page.locator("[data-tab='all']").focus()
    services.apply_snapshot(task=first, snapshot=snapshot("r-1", statusMessage=f"copying files (2/3) {HOSTILE}"))
    expect(row).to_contain_text(f"copying files (2/3) {HOSTILE}")
    expect(row).to_have_class(re.compile(r"\bis-fresh\b"))
    expect(page.locator("#task-live-status")).to_have_text("Task list updated: 1 task changed.", timeout=8000)
    # the list was swapped under it: the same tab, in the new list, has the focus (not the page's body)
    assert page.evaluate("document.activeElement.dataset.tab") == "all"

    # a new task slides in at the top, and the counts follow
    newest = services.launch(server=with_tools(beta, "migrate"), tool="migrate", arguments={}, user=olga)
    expect(page.locator("tbody tr").first).to_have_id(f"task-row-{newest.pk}")
    expect(page.locator("tbody tr").first).to_have_class(re.compile(r"\bis-new\b"))
    screenshot(page, "tasks-list-live-highlight")
    expect(page.locator("[data-tab='all'] .count")).to_have_text("4")
    expect(page.locator("[data-tab='other'] .count")).to_have_text("1")

    # a filtered page stays filtered: a task of another server does not appear in it
    page.get_by_label("Server").select_option(label="alpha")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"/tasks/\?server=\d+"))
    wait_until_live(page)
    page.evaluate("window.__sameDocument = true")
    expect(page.locator("tbody tr")).to_have_count(2)
    services.launch(server=with_tools(beta, "elsewhere"), tool="elsewhere", arguments={}, user=olga)
    services.apply_snapshot(task=first, snapshot=snapshot("r-1", statusMessage="copying files (3/3)"))
    expect(row).to_contain_text("copying files (3/3)")
    expect(page.locator("tbody tr")).to_have_count(2)
    expect(page.locator("[data-tab='all'] .count")).to_have_text("2")

    assert page.evaluate("window.__sameDocument") is True  # never reloaded
    assert page.evaluate("window.__xss") is None
    page.goto(f"{live_site.url}/tasks/")
    screenshot(page, "tasks-list")

    # on another page the list's live signal changes nothing and logs no error
    page.goto(f"{live_site.url}/")
    wait_until_live(page)
    services.apply_snapshot(task=first, snapshot=snapshot("r-1", statusMessage="elsewhere"))
    page.wait_for_timeout(800)
    assert not console_errors.seen, console_errors.report()

    dark = new_page(color_scheme="dark")
    sign_in(dark, live_site.url, "olga", TEST_PASSWORD)
    dark.goto(f"{live_site.url}/tasks/")
    expect(dark.locator("tbody tr")).to_have_count(5)
    screenshot(dark, "tasks-list-dark")


def test_the_list_shows_a_changed_row_without_waiting_for_its_re_fetch(live_site, new_page, console_errors):
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    task = durable(alpha, olga, "deploy", "r-1", statusMessage="copying files (1/3)")
    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/")
    wait_until_live(page)
    refused = []

    def refuse_re_fetches(route):
        if route.request.headers.get("hx-request"):
            refused.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.route(re.compile(r"/tasks/(\?.*)?$"), refuse_re_fetches)
    # The refused re-fetch is logged (the browser's failed load, htmx's error events), and nothing else.
    with console_errors.expect(page, "net::ERR_FAILED|htmx:sendError|htmx:afterRequest"):
        services.apply_snapshot(
            task=task,
            snapshot=snapshot("r-1", "completed", statusMessage=f"all copied {HOSTILE}", result={"content": []}),
        )
        # the row came with the live signal: shown although every re-fetch of the table is refused here
        row = page.locator(f"#task-row-{task.pk}")
        expect(row).to_have_class(re.compile(r"\brow-completed\b"))
        expect(row).to_have_class(re.compile(r"\bis-fresh\b"))
        expect(row).to_contain_text(f"all copied {HOSTILE}")
        page.wait_for_timeout(500)
    assert refused, "the list still asks for the table after the row"
    assert page.evaluate("window.__xss") is None


def test_the_detail_cancels_then_finishes_anyway_without_a_reload(live_site, new_page, console_errors):
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    task = durable(alpha, olga, "deploy", "r-9", statusMessage=f"building {HOSTILE}", pollIntervalMs=2000)

    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/{task.pk}/")
    wait_until_live(page)
    page.evaluate("window.__sameDocument = true")
    header = page.locator(f"#task-{task.pk}-header")
    expect(header.locator(".pill")).to_have_text("working")
    expect(page.locator(f"#task-{task.pk}-message")).to_contain_text(f"server says: building {HOSTILE}")

    page.get_by_role("link", name="Cancel task…").click()  # the confirm step opens under the header
    page.get_by_role("button", name="Yes, cancel the task").click()
    expect(header).to_contain_text("Cancel requested by olga")
    expect(page.get_by_role("link", name="Cancel task…")).to_have_count(0)
    expect(page.get_by_role("button", name="Yes, cancel the task")).to_have_count(0)
    services.apply_snapshot(task=task, snapshot=snapshot("r-9", statusMessage="stopping soon", pollIntervalMs=2000))
    expect(page.locator(f"#task-{task.pk}-message")).to_contain_text("stopping soon")
    expect(header).to_contain_text("Cancel requested by olga")
    screenshot(page, "task-detail-cancel-requested")

    result = {
        "content": [
            {"type": "text", "text": "Deployed 3 services.\n<script>window.__xss = 1</script>"},
            {"type": "image", "mimeType": "image/png", "data": png()},
            {"type": "resource_link", "name": "release notes", "uri": "https://example.com/notes"},
            {"type": "resource_link", "name": "sneaky", "uri": "javascript:window.__xss=1"},
        ],
        "structuredContent": {"services": ["api", "web", "worker"], "duration_s": 42},
    }
    services.apply_snapshot(task=task, snapshot=snapshot("r-9", "completed", statusMessage="all done", result=result))
    expect(header.locator(".pill")).to_have_text("completed")
    expect(header).to_contain_text("Finished anyway")
    result_section = page.locator(f"#task-{task.pk}-result")
    expect(result_section).to_contain_text("<script>window.__xss = 1</script>")
    expect(result_section.locator("img.result-image")).to_be_visible()
    expect(result_section.get_by_role("link", name="https://example.com/notes")).to_have_attribute(
        "rel", "noopener noreferrer"
    )
    expect(result_section.get_by_role("link")).to_have_count(1)
    expect(result_section).to_contain_text('"duration_s": 42')
    expect(page.locator(f"#task-{task.pk}-timeline .timeline-entry").last).to_contain_text("task status changed")

    assert page.evaluate("window.__sameDocument") is True
    assert page.evaluate("window.__xss") is None
    assert not console_errors.seen, console_errors.report()
    screenshot(page, "task-detail-completed")

    dark = new_page(color_scheme="dark")
    sign_in(dark, live_site.url, "olga", TEST_PASSWORD)
    dark.goto(f"{live_site.url}/tasks/{task.pk}/")
    expect(dark.locator(f"#task-{task.pk}-header")).to_contain_text("Finished anyway")
    screenshot(dark, "task-detail-completed-dark")


def test_someone_made_an_approver_while_a_page_is_open_gets_the_inbox_link_and_its_count(
    live_site, new_page, console_errors
):
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    task = durable(alpha, olga, "deploy", "r-1")

    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/")
    wait_until_live(page)
    inbox = page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("^Inbox"))
    expect(inbox).to_have_count(0)  # not an approver: the item is there for the socket, hidden

    alpha_approvers = Group.objects.create(name="alpha-approvers")
    set_approver_groups(alpha, [alpha_approvers])
    olga.groups.add(Group.objects.get_or_create(name=APPROVERS)[0], alpha_approvers)
    services.apply_snapshot(task=task, snapshot=snapshot("r-1", "input_required", inputRequests={"ok": ASK}))
    expect(inbox).to_be_visible()
    expect(page.locator("#nav-inbox-count")).to_have_text("1")
    # Every push found its target on the task list: the nav's count, the inbox's signal (htmx reports a missing one).
    assert not console_errors.seen, console_errors.report()

    # On the task's page a colleague's answer replaces the card in place (the inbox's signal, placed by live.js).
    page.goto(f"{live_site.url}/tasks/{task.pk}/")
    wait_until_live(page)
    request = task.input_requests.get()
    card = page.locator(f"#ir-{request.pk}")
    expect(card.get_by_role("button", name="Accept")).to_be_visible()
    colleague = make_user("ada", APPROVERS, "alpha-approvers")
    services.answer_input(input_request=request, response={"action": "accept", "content": {}}, user=colleague)
    expect(card).to_contain_text("answered by ada")
    expect(page.locator(".ir-card")).to_have_count(1)

    # On a page that shows no card, the closed card's push changes nothing and logs no error.
    page.goto(f"{live_site.url}/")
    wait_until_live(page)
    page.evaluate(COUNT_INBOX_PUSHES)
    services.mark_delivered(input_request=request)
    page.wait_for_function("() => window.__inboxPushes > 0")
    assert not console_errors.seen, console_errors.report()


def test_an_agents_task_is_marked_in_the_list_live_filtered_by_agent_and_named_on_its_page(
    live_site, new_page, console_errors
):
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    bot = make_user("ci-bot", AGENTS, password=TEST_PASSWORD)
    token, _ = create_token(user=bot, name=f"nightly {HOSTILE}")
    alpha = with_tools(create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None), "deploy")
    by_hand = services.launch(server=alpha, tool="deploy", arguments={}, user=olga)

    page = new_page()
    sign_in(page, live_site.url, "olga", TEST_PASSWORD)
    page.goto(f"{live_site.url}/tasks/")
    wait_until_live(page)
    expect(page.locator(f"#task-row-{by_hand.pk} [data-agent]")).to_have_count(0)

    # A task an agent launches slides in live, marked, the token named on hover.
    by_bot = services.launch(server=alpha, tool="deploy", arguments={}, user=bot, token=token)
    marker = page.locator(f"#task-row-{by_bot.pk} [data-agent]")
    expect(marker).to_have_text("agent")
    expect(marker).to_have_attribute("title", f"via the API token nightly {HOSTILE} ({token.prefix}…)")

    page.get_by_label("Agent").select_option("any")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"/tasks/\?.*agent=any"))
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator("tbody tr").first).to_have_id(f"task-row-{by_bot.pk}")
    screenshot(page, "tasks-list-agents")

    page.locator(f"#task-row-{by_bot.pk} a").first.click()
    expect(page.locator(".task-byline")).to_contain_text(f"Launched by ci-bot via nightly {HOSTILE} ({token.prefix}…)")
    screenshot(page, "task-launched-by-agent")
    assert page.evaluate("window.__xss") is None
    assert not console_errors.seen, console_errors.report()

    # The agent's own account, signed in: its home says what it is for; no task list in its nav.
    agent_page = new_page()
    sign_in(agent_page, live_site.url, "ci-bot", TEST_PASSWORD)
    agent_page.goto(f"{live_site.url}/")
    expect(agent_page.locator("#dash-agent")).to_contain_text("agents group")
    nav = agent_page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name=re.compile("^Tasks"))).to_have_count(0)
    expect(nav.get_by_role("link", name="API tokens")).to_be_visible()
    screenshot(agent_page, "agent-home")
    assert not console_errors.seen, console_errors.report()
