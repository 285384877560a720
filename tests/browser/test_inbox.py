"""The approver inbox in a real browser: live cards between two approvers, URL mode, every field type, the keyboard."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from taskhub.accounts.groups import APPROVERS
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.approval_fixtures import add_approver_groups
from tests.browser_fixtures import screenshot, sign_in
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot
from tests.inbox_fixtures import request_of, task_asking

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Your name", "description": "As it should appear on the badge.",
                 "minLength": 2, "maxLength": 20},
        "email": {"type": "string", "title": "Email", "format": "email"},
        "homepage": {"type": "string", "title": "Homepage", "format": "uri"},
        "birthday": {"type": "string", "title": "Birthday", "format": "date"},
        "meeting": {"type": "string", "title": "Meeting", "format": "date-time"},
        "count": {"type": "integer", "title": "Guests", "minimum": 1, "maximum": 5, "default": 2},
        "ratio": {"type": "number", "title": "Share", "minimum": 0, "maximum": 1},
        "agree": {"type": "boolean", "title": "I agree to the terms"},
        "size": {"type": "string", "title": "T-shirt", "enum": ["S", "M", "L"],
                 "enumNames": ["Small", "Medium", "Large"]},
        "colour": {"type": "string", "title": "Colour",
                   "oneOf": [{"const": "red", "title": "Red"}, {"const": "blue", "title": "Blue"}]},
        "toppings": {
            "type": "array",
            "title": "Toppings",
            "items": {"type": "string", "anyOf": [{"const": "cheese", "title": "Cheese"},
                                                  {"const": "ham", "title": "Ham"},
                                                  {"const": "olives", "title": "Olives"}]},
            "maxItems": 2,
        },
    },
    "required": ["name", "count"],
}  # fmt: skip
APPROVE = {
    "method": "elicitation/create",
    "params": {
        "message": "Deploy build 4127 to production?",
        "requestedSchema": {
            "type": "object",
            "properties": {"reason": {"type": "string", "title": "Reason", "description": "Shown in the change log."}},
            "required": ["reason"],
        },
    },
}
FORM = {"method": "elicitation/create", "params": {"message": "Register for the offsite.", "requestedSchema": SCHEMA}}


def url_request(url: str) -> dict:
    return {
        "method": "elicitation/create",
        "params": {"mode": "url", "message": "Sign in to the billing system so I can fetch the invoice.", "url": url},
    }


@pytest.fixture
def server(transactional_db):
    server = create_server(name="billing", transport="http", url="http://billing.example/mcp", user=None)
    add_approver_groups(server, Group.objects.create(name="finance"))
    return server


def approver(name: str):
    return make_user(name, APPROVERS, "finance", password=TEST_PASSWORD)


def card(page, input_request):
    return page.locator(f"#ir-{input_request.pk}")


@pytest.mark.slow
def test_two_approvers_on_one_inbox_see_each_others_answers_live(daphne_server, new_page, server):
    approver("ada")
    approver("dana")
    deploy = task_asking(server, {"approve": APPROVE, "also": APPROVE}, tool="deploy")
    first, second = request_of(deploy, "approve"), request_of(deploy, "also")
    pages = {}
    for name in ("ada", "dana"):
        pages[name] = new_page()
        sign_in(pages[name], daphne_server.url, name, TEST_PASSWORD)
        pages[name].goto(f"{daphne_server.url}/inbox/")
        expect(pages[name].locator("#live-indicator")).to_have_attribute("data-state", "live")
    ada, dana = pages["ada"], pages["dana"]
    expect(ada.locator(".ir-card")).to_have_count(2)
    expect(card(ada, first).locator(".ir-ordinal")).to_have_text("request 1 of 2")

    # Ada starts typing in the second card; a request that arrives meanwhile must not wipe it.
    card(ada, second).get_by_label("Reason").fill("half typed")
    later = task_asking(server, {"invoice": url_request("https://pay.example/approve")}, tool="pay_invoice")
    # (made here, in the test process, whose publishes do not reach daphne: it shows up through the re-fetch below)

    card(dana, first).get_by_label("Reason").fill("Release train 42")
    card(dana, first).get_by_role("button", name="Accept").click()
    expect(card(dana, first)).to_contain_text("answered by you")
    expect(card(dana, first)).to_contain_text("delivering…")

    expect(card(ada, first)).to_contain_text("answered by dana")
    expect(card(ada, first)).to_contain_text("(accepted)")
    # The cards put in place of the shown ones (Dana's by htmx, Ada's live) keep their number.
    expect(card(dana, first).locator(".ir-ordinal")).to_have_text("request 1 of 2")
    expect(card(ada, first).locator(".ir-ordinal")).to_have_text("request 1 of 2")
    expect(card(ada, request_of(later, "invoice"))).to_be_visible()  # the live marker made the list re-fetch
    expect(card(ada, second).get_by_label("Reason")).to_have_value("half typed")
    first.refresh_from_db()
    assert first.state == InputRequestState.ANSWERED and first.answered_by.username == "dana"
    screenshot(ada, "inbox-answered-by-colleague")

    # Ada answers the same card Dana already answered (her page raced): she is told who won.
    card(ada, second).get_by_role("button", name="Decline").click()
    expect(card(dana, second)).to_contain_text("answered by ada")


class _Hits(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self):
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<!doctype html><title>consent</title><p>signed in</p>")

    def log_message(self, *args):
        pass


@pytest.fixture
def url_host():
    _Hits.hits = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hits)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], _Hits.hits
    httpd.shutdown()


def test_a_url_request_loads_nothing_before_the_click_then_opens_in_a_new_tab(daphne_server, page, server, url_host):
    port, hits = url_host
    approver("ada")
    target = f"http://localhost:{port}/consent?session=abc"
    task = task_asking(server, {"signin": url_request(target)}, tool="fetch_invoice")
    bad = task_asking(server, {"bad": url_request("javascript:alert(document.cookie)")}, tool="sneaky")
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/inbox/")
    signin = card(page, request_of(task, "signin"))
    expect(signin.locator(".ir-host")).to_have_text("localhost")
    expect(signin.locator(".ir-url-text")).to_have_text(target)
    sneaky = card(page, request_of(bad, "bad"))
    expect(sneaky).to_contain_text("taskhub opens only https: links")
    expect(sneaky.get_by_role("button", name="Accept")).to_have_count(0)
    expect(sneaky.locator("a[href^='javascript']")).to_have_count(0)
    page.wait_for_timeout(500)
    assert not [url for url in requested if f":{port}" in url]
    assert hits == []
    screenshot(page, "inbox-url-mode")

    with page.expect_popup() as popup_info:
        signin.get_by_role("link", name="Open localhost in a new tab").click()
    popup = popup_info.value
    popup.wait_for_load_state()
    assert hits[0] == "/consent?session=abc"
    assert popup.evaluate("window.opener") is None  # rel="noopener"
    popup.close()

    signin.get_by_role("button", name="Accept").click()
    expect(signin).to_contain_text("answered by you")
    answered = request_of(task, "signin")
    assert answered.answer == {"action": "accept"}


def test_every_field_type_filled_and_accepted_and_errors_shown_inline(daphne_server, new_page, server):
    approver("ada")
    task = task_asking(server, {"register": FORM}, tool="register")
    request = request_of(task, "register")
    page = new_page()
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/inbox/")
    form = card(page, request)
    expect(form.get_by_label("Guests")).to_have_value("2")

    # What the browser lets through but the server refuses: shown inline, input kept, nothing recorded.
    form.get_by_label("Your name").fill("Ada")
    form.get_by_label("Email").fill("ada@localhost")
    for choice in ("Cheese", "Ham", "Olives"):
        form.get_by_label(choice).check()
    form.get_by_role("button", name="Accept").click()
    expect(form.locator(".field-error")).to_have_count(2)
    expect(form).to_contain_text("Email: must be an email address like name@example.com")
    expect(form).to_contain_text("Toppings: pick at most 2")
    expect(form.get_by_label("Email")).to_have_value("ada@localhost")
    expect(form.get_by_label("Olives")).to_be_checked()
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "inbox-card-errors")

    form.get_by_label("Your name").fill("Ada Lovelace")
    form.get_by_label("Email").fill("ada@example.com")
    form.get_by_label("Homepage").fill("https://ada.example/")
    form.get_by_label("Birthday").fill("1815-12-10")
    form.get_by_label("Meeting").fill("2026-07-28T14:30")
    form.get_by_label("Guests").fill("3")
    form.get_by_label("Share").fill("0.25")
    form.get_by_label("I agree to the terms").check()
    form.get_by_label("T-shirt").select_option(label="Medium")
    form.get_by_label("Colour").select_option(label="Blue")
    form.get_by_label("Ham").uncheck()
    form.get_by_role("button", name="Accept").click()
    expect(form).to_contain_text("answered by you")
    request.refresh_from_db()
    assert request.answer == {
        "action": "accept",
        "content": {
            "name": "Ada Lovelace",
            "email": "ada@example.com",
            "homepage": "https://ada.example/",
            "birthday": "1815-12-10",
            "meeting": "2026-07-28T14:30:00Z",
            "count": 3,
            "ratio": 0.25,
            "agree": True,
            "size": "M",
            "colour": "blue",
            "toppings": ["cheese", "olives"],
        },
    }


def test_the_keyboard_moves_between_cards_and_ctrl_enter_accepts(daphne_server, page, server):
    approver("ada")
    tasks = [task_asking(server, {"approve": APPROVE}, tool=f"deploy_{n}") for n in range(3)]
    requests = [request_of(task, "approve") for task in tasks]
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/inbox/")
    expect(page.locator(".ir-card")).to_have_count(3)

    page.keyboard.press("j")
    expect(card(page, requests[0])).to_be_focused()
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(card(page, requests[2])).to_be_focused()
    page.keyboard.press("j")
    expect(card(page, requests[2])).to_be_focused()
    page.keyboard.press("k")
    expect(card(page, requests[1])).to_be_focused()
    page.keyboard.press("Enter")
    field = card(page, requests[1]).get_by_label("Reason")
    expect(field).to_be_focused()
    page.keyboard.type("jk typed, not moving")
    expect(field).to_have_value("jk typed, not moving")
    page.keyboard.press("Control+Enter")
    expect(card(page, requests[1])).to_contain_text("answered by you")
    assert request_of(tasks[1], "approve").answer == {"action": "accept", "content": {"reason": "jk typed, not moving"}}


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_screenshots_of_an_inbox_with_several_cards(daphne_server, new_page, server, scheme):
    approver("ada")
    task_asking(server, {"approve": APPROVE}, tool="deploy_service")
    task_asking(server, {"register": FORM}, tool="register")
    task_asking(server, {"signin": url_request("https://billing.example.com/oauth/authorize?client=taskhub")},
                tool="fetch_invoice")  # fmt: skip
    task_asking(server, {"sample": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 50}}},
                tool="summarise")  # fmt: skip
    page = new_page(color_scheme=scheme)
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/inbox/")
    expect(page.locator(".ir-card")).to_have_count(4)
    screenshot(page, f"inbox-{scheme}")


def test_screenshot_of_an_empty_inbox(daphne_server, page, server):
    approver("ada")
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/inbox/")
    expect(page.get_by_text("Nothing waiting for you")).to_be_visible()
    screenshot(page, "inbox-empty")


def test_a_flooding_server_is_grouped_and_the_inbox_filters_by_server_and_pages(daphne_server, page, server):
    approver("ada")
    ops = create_server(name="ops", transport="http", url="http://ops.example/mcp", user=None)
    add_approver_groups(ops, Group.objects.get(name="finance"))
    flood = task_asking(server, {"k0": APPROVE}, tool="bulk_refund")
    InputRequest.objects.bulk_create(
        InputRequest(task=flood, server=server, key=f"k{n}", method="elicitation/create", params=APPROVE["params"])
        for n in range(1, 60)
    )
    quiet = task_asking(ops, {"restart": APPROVE}, tool="restart")
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/inbox/")

    # The flood is one line; the other server's request is on the first page.
    expect(page.locator(".inbox-flood")).to_contain_text("60 open requests from billing")
    expect(page.locator(".ir-card")).to_have_count(1)
    expect(card(page, request_of(quiet, "restart"))).to_be_visible()
    screenshot(page, "inbox-flood-grouped")

    page.locator(".inbox-flood").get_by_role("link", name="show them").click()
    expect(page.locator(".ir-card")).to_have_count(50)
    expect(page.get_by_label("Server", exact=True)).to_have_value(str(server.pk))
    expect(page.locator("#inbox-pager")).to_contain_text("Page 1 of 2 · 60 requests")
    page.locator("#inbox-pager").get_by_role("link", name="Newer →").click()
    expect(page.locator(".ir-card")).to_have_count(10)
    assert f"server={server.pk}" in page.url and "page=2" in page.url
    expect(card(page, request_of(flood, "k59"))).to_be_visible()
    screenshot(page, "inbox-flood-page-2")

    # The live re-fetch (here on a resync) keeps the filter and the page: the newest request of billing joins page 2,
    # nothing of ops or of page 1 does.
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    older = page.locator("#inbox-pager").get_by_role("link", name="← Older")
    older.focus()  # a keyboard user on the pager as the list is re-fetched: the pager is replaced, the focus stays
    newest = task_asking(server, {"late": APPROVE}, tool="bulk_refund")
    task_asking(ops, {"other": APPROVE}, tool="restart")
    page.evaluate("document.body.dispatchEvent(new CustomEvent('taskhub:live-resync'))")
    expect(card(page, request_of(newest, "late"))).to_be_visible()
    expect(page.locator(".ir-card")).to_have_count(11)
    expect(page.locator("#inbox-pager")).to_contain_text("Page 2 of 2 · 61 requests")
    expect(older).to_be_focused()

    # The filter bar: another server, and a tool.
    page.get_by_label("Server", exact=True).select_option(label="ops")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(".ir-card")).to_have_count(2)
    expect(page.locator("#inbox-pager")).to_be_hidden()
    page.get_by_label("Server", exact=True).select_option(label="any server")
    page.get_by_label("Tool", exact=True).fill("bulk_refund")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(".ir-card")).to_have_count(50)  # one server left: listed, not grouped
    expect(page.locator(".inbox-flood")).to_have_count(0)


@pytest.mark.slow
def test_a_card_uses_the_width_and_shows_the_launch_and_what_came_before(daphne_server, page, server):
    """Issue 34, item 10: at 1280 px a card took about 60 % of the screen, and what the task was launched with and
    what happened before the question were on another page."""
    approver("ada")
    task = services.launch(
        server=with_tools(server, "pay_invoice"), tool="pay_invoice", arguments={"invoice": "INV-7731"}, user=None
    )
    services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id="r-pay")))
    services.apply_snapshot(
        task=task,
        snapshot=snapshot(
            "input_required", task_id="r-pay", statusMessage="matched 3 of 4 lines", inputRequests={"approve": APPROVE}
        ),
    )
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.goto(f"{daphne_server.url}/inbox/")
    shown = card(page, request_of(task, "approve"))
    context = shown.locator(".ir-context")
    expect(context.locator(".ir-context-arguments")).to_contain_text('"invoice": "INV-7731"')
    expect(context.locator(".ir-before-list")).to_contain_text("tool call launched")
    expect(context.locator(".ir-before-status")).to_have_text("server says: matched 3 of 4 lines")
    assert shown.bounding_box()["width"] >= 0.85 * 1280
    form, beside = shown.locator(".ir-form").bounding_box(), context.bounding_box()
    assert beside["x"] >= form["x"] + form["width"]  # beside the form, not below it
    screenshot(page, "inbox-card-context")
