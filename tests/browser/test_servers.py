"""In a real browser: an admin registers the demo MCP server, a worker discovers it while its page shows that
live; an operator launches a tool from the form generated from its inputSchema and lands on the new task's page."""

import re

import pytest
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.servers.models import Server
from taskhub.tasks.models import Task
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import screenshot as save_screenshot
from tests.browser_fixtures import sign_in
from tests.demo_process import DemoServer, free_port

pytestmark = pytest.mark.slow

# A refused form comes back with status 400, which the browser logs as an error.
REFUSED_FORM = "the server responded with a status of 400"


def screenshot(page, name):
    page.evaluate("window.scrollTo(0, 0)")  # a scrolled page pins the sticky top bar mid-picture
    return save_screenshot(page, name)


# The demo server holds tools/list this long, so the page shows the discovery running before its outcome.
LIST_DELAY_MS = 2000
# A discovery's outcome comes after the worker picked its job up and the slow server answered.
LATE_MS = 30_000


@pytest.fixture
def demo():
    with DemoServer("--list-delay-ms", str(LIST_DELAY_MS)) as server:
        yield server


def test_admin_adds_and_discovers_the_demo_server_then_an_operator_launches_a_tool(
    daphne_server, new_page, demo, workers, console_errors
):
    base = daphne_server.url
    workers.start(f"servers-{demo.port}")
    make_user("alex", ADMINS, password=TEST_PASSWORD)
    make_user("olga", OPERATORS, password=TEST_PASSWORD)

    # --- the admin registers the demo server ---
    admin = new_page()
    sign_in(admin, base, "alex", TEST_PASSWORD)
    admin.get_by_role("navigation", name="Main").get_by_role("link", name="Servers").click()
    expect(admin.get_by_role("heading", name="No servers yet")).to_be_visible()
    screenshot(admin, "servers-empty")
    admin.get_by_role("link", name="Add a server").click()

    admin.get_by_label("Name").fill("Demo server")
    admin.get_by_label("URL").fill(demo.url)
    expect(admin.get_by_label("Command")).to_be_hidden()  # only the chosen transport's fields
    admin.get_by_label("Bearer token").fill("a-token-nobody-sees")
    admin.get_by_label("Extra HTTP headers").fill("X-Demo-Key: also-secret")
    screenshot(admin, "servers-form")
    admin.get_by_role("button", name="Add server").click()

    expect(admin).to_have_url(re.compile(rf"{base}/servers/\d+/$"))
    expect(admin.locator("p.notice").first).to_contain_text("Server Demo server added")
    assert "a-token-nobody-sees" not in admin.content() and "also-secret" not in admin.content()
    # The page came back at once; the worker discovers meanwhile, and the page shows it, then its outcome,
    # without a reload (the mark set on this page's window would not survive one).
    admin.evaluate("window.sameDocument = true")
    discovery = admin.locator("#server-discovery")
    expect(discovery.get_by_role("status")).to_contain_text("Discovering…")
    screenshot(admin, "servers-discovering")
    expect(discovery.get_by_role("status")).to_contain_text("Discovered Demo server: 9 tools", timeout=LATE_MS)
    assert admin.evaluate("window.sameDocument === true")
    tools = admin.get_by_role("region", name="Tools")
    expect(tools.get_by_text("approval", exact=True)).to_be_visible()
    expect(tools.get_by_text("Ask a human to approve")).to_be_visible()
    tools.get_by_text("Input schema").first.click()  # collapsible
    expect(admin.get_by_role("region", name="Health")).to_contain_text("reachable")
    screenshot(admin, "servers-detail")

    # "Discover now" asks again, the same way.
    admin.get_by_role("button", name="Discover now").click()
    expect(discovery.get_by_role("status")).to_contain_text("Discovering…")
    expect(discovery.get_by_role("status")).to_contain_text("Discovered Demo server: 9 tools", timeout=LATE_MS)

    # The edit form shows names of credentials, never values; an error keeps nothing secret on the page.
    admin.get_by_role("link", name="Edit").click()
    expect(admin.get_by_text("X-Demo-Key")).to_be_visible()
    admin.get_by_label("URL").fill("")
    with console_errors.expect(admin, REFUSED_FORM):
        admin.get_by_role("button", name="Save").click()
        expect(admin.get_by_role("alert")).to_contain_text("The server was not saved")
    expect(admin.get_by_text("A Streamable HTTP server needs its URL.")).to_be_visible()
    assert "a-token-nobody-sees" not in admin.content()
    screenshot(admin, "servers-form-error")

    # A second server where nothing listens: discovery says so and the list shows it unreachable.
    admin.goto(f"{base}/servers/add/")
    admin.get_by_label("Name").fill("Nowhere")
    admin.get_by_label("URL").fill(f"http://127.0.0.1:{free_port()}/mcp")
    admin.get_by_role("button", name="Add server").click()
    expect(admin.get_by_role("alert")).to_contain_text("Discovery of Nowhere failed", timeout=LATE_MS)
    expect(admin.get_by_role("region", name="Health")).to_contain_text("unreachable since")
    screenshot(admin, "servers-discovery-failed")
    # And one stdio server never contacted: no worker runs any more, so its discovery waits.
    workers.stop_all()
    admin.goto(f"{base}/servers/add/")
    admin.get_by_label("Name").fill("Local tool")
    admin.get_by_label("stdio").check()
    expect(admin.get_by_text("taskhub keeps one process of this program running")).to_be_visible()
    admin.get_by_label("Command").fill("python3")
    admin.get_by_label("Arguments").fill("-m\ntaskhub.demo\n--stdio")
    admin.get_by_role("button", name="Add server").click()
    expect(admin.locator("#server-discovery").get_by_role("status")).to_contain_text("Discovering…")
    expect(admin.get_by_role("region", name="Process")).to_contain_text("no worker has taken this server yet")
    admin.get_by_role("navigation", name="Main").get_by_role("link", name="Servers").click()
    table = admin.get_by_role("table")
    expect(table.get_by_role("row", name=re.compile("Demo server"))).to_contain_text("reachable")
    expect(table.get_by_role("row", name=re.compile("Nowhere"))).to_contain_text("unreachable since")
    expect(table.get_by_role("row", name=re.compile("Local tool"))).to_contain_text("never contacted")
    screenshot(admin, "servers-list")
    dark = new_page(color_scheme="dark")
    sign_in(dark, base, "alex", TEST_PASSWORD)
    dark.goto(f"{base}/servers/")
    screenshot(dark, "servers-list-dark")
    dark.goto(f"{base}/servers/{Server.objects.get(name='Demo server').pk}/")
    screenshot(dark, "servers-detail-dark")

    # --- the operator launches ---
    operator = new_page()
    sign_in(operator, base, "olga", TEST_PASSWORD)
    operator.get_by_role("navigation", name="Main").get_by_role("link", name="Launch").click()
    demo_section = operator.get_by_role("region", name="Demo server")
    expect(demo_section.get_by_role("link", name="approval")).to_be_visible()
    expect(operator.get_by_role("region", name="Local tool")).to_contain_text("has not been discovered yet")
    screenshot(operator, "launch-chooser")

    # A bad value is refused next to its field.
    demo_section.get_by_role("link", name="progress").click()
    operator.get_by_label("Steps").fill("0")
    with console_errors.expect(operator, REFUSED_FORM):
        operator.get_by_role("button", name="Launch").click()
        expect(operator.get_by_role("alert")).to_contain_text("Some arguments need a fix")
    expect(operator.get_by_text("must be at least 1")).to_be_visible()
    screenshot(operator, "launch-form-error")
    assert not Task.objects.exists()

    # Edit as JSON, and back, keeps what was typed.
    operator.get_by_label("Steps").fill("3")
    operator.get_by_role("button", name="Edit as JSON").click()
    expect(operator.get_by_label("Arguments (JSON object)")).to_have_value(re.compile(r'"steps": 3'))
    screenshot(operator, "launch-form-json")
    operator.get_by_role("button", name="Back to the form").click()
    expect(operator.get_by_label("Steps")).to_have_value("3")

    operator.get_by_role("link", name="Choose another tool").click()
    operator.get_by_role("region", name="Demo server").get_by_role("link", name="approval").click()
    expect(operator.get_by_label("Action")).to_have_value("deploy")
    operator.get_by_label("Action").fill("ship release 1.2")
    screenshot(operator, "launch-form")
    operator.get_by_role("button", name="Launch").click()

    expect(operator).to_have_url(re.compile(rf"{base}/tasks/[0-9a-f-]{{36}}/$"))
    task = Task.objects.get()
    assert operator.url == f"{base}/tasks/{task.id}/"
    assert (task.tool, task.arguments) == ("approval", {"action": "ship release 1.2"})
    assert task.launched_by.username == "olga"
    assert task.server.name == "Demo server"

    dark_operator = new_page(color_scheme="dark")
    sign_in(dark_operator, base, "olga", TEST_PASSWORD)
    dark_operator.goto(f"{base}/launch/{task.server_id}/progress/")
    dark_operator.get_by_label("Steps").fill("5000")
    with console_errors.expect(dark_operator, REFUSED_FORM):
        dark_operator.get_by_role("button", name="Launch").click()
        expect(dark_operator.get_by_text("must be at most 1000")).to_be_visible()
    screenshot(dark_operator, "launch-form-error-dark")


RICH_TOOL = {
    "name": "schedule",
    "title": "Schedule a maintenance window",
    "description": "Books a window and notifies people. <img src=x onerror=alert(1)>",
    "annotations": {"destructiveHint": True, "idempotentHint": True},
    "execution": {"taskSupport": "optional"},
    "inputSchema": {
        "type": "object",
        "properties": {
            "owner": {"type": "string", "format": "email", "title": "Owner", "description": "Who answers for it."},
            "day": {"type": "string", "format": "date", "title": "Day"},
            "starts": {"type": "string", "format": "date-time", "title": "Starts at"},
            "hours": {"type": "number", "minimum": 0.5, "maximum": 12, "default": 2, "title": "Hours"},
            "region": {
                "title": "Region",
                "oneOf": [{"const": "eu", "title": "Europe"}, {"const": "us", "title": "Americas"}],
                "default": "eu",
            },
            "teams": {"type": "array", "title": "Notify", "items": {"enum": ["ops", "dev", "support"]}},
            "dry_run": {"type": "boolean", "title": "Dry run", "default": True},
            "ticket": {"type": "string", "pattern": "^OPS-[0-9]+$", "title": "Ticket", "description": "e.g. OPS-1234"},
        },
        "required": ["owner", "day", "region"],
    },
}


def test_a_rich_schema_renders_as_a_form_with_every_kind_of_field(daphne_server, new_page, console_errors):
    from django.utils import timezone

    from taskhub.servers.services import create_server

    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    server = create_server(name="Maintenance", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    Server.objects.filter(pk=server.pk).update(tools=[RICH_TOOL], discovered_at=timezone.now())
    dialogs = []
    for scheme in ("light", "dark"):
        page = new_page(color_scheme=scheme)
        page.on("dialog", lambda dialog: dialogs.append(dialog.message) or dialog.dismiss())
        sign_in(page, daphne_server.url, "olga", TEST_PASSWORD)
        page.goto(f"{daphne_server.url}/launch/")
        expect(page.get_by_text("<img src=x onerror=alert(1)>", exact=False)).to_be_visible()
        page.get_by_role("link", name="Schedule a maintenance window").click()
        expect(page.get_by_label("Region")).to_have_value("0")
        page.get_by_label("Owner").fill("not an email")
        page.get_by_label("Ticket").fill("ops 12")
        page.get_by_label("dev").check()
        with console_errors.expect(page, REFUSED_FORM):
            page.get_by_role("button", name="Launch").click()
            expect(page.get_by_text("must be an email address like name@example.com")).to_be_visible()
        expect(page.get_by_text("must match the pattern ^OPS-[0-9]+$")).to_be_visible()
        expect(page.get_by_label("Day")).to_have_attribute("type", "date")
        expect(page.get_by_label("dev")).to_be_checked()
        screenshot(page, f"launch-form-rich-{scheme}")
        assert dialogs == []

    page.get_by_label("Owner").fill("ana@example.com")
    page.get_by_label("Day").fill("2026-12-01")
    page.get_by_label("Starts at").fill("2026-12-01T22:30:00")
    page.get_by_label("Ticket").fill("OPS-12")
    page.get_by_role("button", name="Launch").click()
    expect(page).to_have_url(re.compile(r"/tasks/[0-9a-f-]{36}/$"))
    assert Task.objects.get().arguments == {
        "owner": "ana@example.com",
        "day": "2026-12-01",
        "starts": "2026-12-01T22:30:00Z",
        "hours": 2,
        "region": "eu",
        "teams": ["dev"],
        "dry_run": True,
        "ticket": "OPS-12",
    }
