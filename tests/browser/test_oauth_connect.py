"""In a real browser (issue 33): an admin adds a server protected by a real authorization server (the demo MCP server
behind tests/oauth_server.py), a worker's discovery meets its 401 challenge and the page says it needs authorization;
Connect takes the browser to the authorization server (which approves at once) and back to taskhub's callback; the
worker then discovers the server's tools with the token taskhub kept. An operator launches; the access token (six
seconds of life here) expires and the worker refreshes it with nobody noticing; then the authorization server revokes
everything: the server shows "needs re-authorization" on its page and on Home, a launch waits, the admin connects
again, and the launch goes out once."""

import re

import pytest
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.servers.models import Server, ServerAuthorization
from taskhub.tasks.models import Task, TaskStatus
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import sign_in
from tests.demo_process import DemoServer
from tests.helpers import let_time_pass, wait_until
from tests.oauth_server import protecting
from tests.stack_fixtures import demo_stats

pytestmark = pytest.mark.slow

LATE_MS = 30_000
ACCESS_SECONDS = 6


@pytest.fixture
def demo():
    with DemoServer("--poll-interval-ms", "200") as server:
        yield server


@pytest.fixture
def protected_demo(demo):
    with protecting(demo.url, access_expires_in=ACCESS_SECONDS) as server:
        yield server


def test_an_admin_connects_a_server_behind_oauth_and_its_work_waits_for_a_reconnect(
    daphne_server, new_page, demo, protected_demo, workers
):
    base = daphne_server.url
    workers.start("oauth-connect")
    make_user("alex", ADMINS, password=TEST_PASSWORD)
    make_user("olga", OPERATORS, password=TEST_PASSWORD)

    admin = new_page()
    sign_in(admin, base, "alex", TEST_PASSWORD)
    admin.goto(f"{base}/servers/add/")
    admin.get_by_label("Name").fill("Guarded")
    admin.get_by_label("URL").fill(f"{protected_demo.url}/mcp")
    admin.get_by_role("button", name="Add server").click()
    expect(admin).to_have_url(re.compile(rf"{base}/servers/\d+/$"))

    discovery = admin.locator("#server-discovery")
    expect(discovery).to_contain_text("Needs authorization", timeout=LATE_MS)
    expect(discovery).to_contain_text("HTTP 401")
    admin.get_by_role("button", name="Connect", exact=True).click()

    # There and back: the authorization server approves without a page, and taskhub's callback takes the answer.
    expect(admin).to_have_url(re.compile(rf"{base}/servers/\d+/$"), timeout=LATE_MS)
    expect(admin.locator("p.notice").filter(has_text="Connected Guarded")).to_be_visible()
    expect(discovery.get_by_role("status")).to_contain_text("Discovered Guarded: 9 tools", timeout=LATE_MS)
    tools = admin.get_by_role("region", name="Tools")
    expect(tools.get_by_text("approval", exact=True)).to_be_visible()
    expect(admin.get_by_role("region", name="Connection")).to_contain_text("connected")
    expect(discovery).not_to_contain_text("Needs authorization")

    server = Server.objects.get(name="Guarded")
    assert server.oauth
    kept = server.authorization.tokens
    assert kept["access_token"] in protected_demo.provider.access
    assert kept["access_token"] not in admin.content() and kept["refresh_token"] not in admin.content()

    # --- an operator launches; the token expires on the way and is refreshed unnoticed ---
    operator = new_page()
    sign_in(operator, base, "olga", TEST_PASSWORD)
    first = launch_progress(operator, base, server)
    let_time_pass(ACCESS_SECONDS + 1, because="the token the admin's Connect got must have expired")
    second = launch_progress(operator, base, server)
    for task in (first, second):
        wait_until(lambda task=task: Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED, what="completed")
    assert protected_demo.provider.refresh_requests >= 1
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is None
    assert demo_stats(demo)["calls"]["progress"] == 2

    # --- the authorization server revokes everything: the server needs an admin, a launch waits ---
    protected_demo.provider.revoke_all()
    waiting = launch_progress(operator, base, server)
    wait_until(
        lambda: ServerAuthorization.objects.get(server=server).needs_reauthorization_since is not None,
        what="the server marked as needing re-authorization",
    )
    admin.goto(f"{base}/")
    expect(admin.locator("#dash-servers")).to_contain_text("needs re-authorization")
    admin.locator("#dash-servers").get_by_role("link", name="Guarded").click()
    expect(discovery).to_contain_text("Needs re-authorization")
    let_time_pass(2, because="the waiting launch's job looks every second and must still send nothing")
    assert Task.objects.get(pk=waiting.pk).status == TaskStatus.LAUNCHING
    assert demo_stats(demo)["calls"]["progress"] == 2

    # --- the admin connects it again: the launch goes out, once ---
    admin.get_by_role("button", name="Connect", exact=True).click()
    expect(admin.locator("p.notice").filter(has_text="Connected Guarded")).to_be_visible(timeout=LATE_MS)
    wait_until(lambda: Task.objects.get(pk=waiting.pk).status == TaskStatus.COMPLETED, what="the waiting launch")
    let_time_pass(1, because="a launch sent twice would reach the server meanwhile")
    assert demo_stats(demo)["calls"]["progress"] == 3


def launch_progress(operator, base: str, server: Server) -> Task:
    operator.goto(f"{base}/launch/{server.pk}/progress/")
    operator.get_by_label("Steps").fill("2")
    operator.get_by_role("button", name="Launch").click()
    expect(operator).to_have_url(re.compile(rf"{base}/tasks/[0-9a-f-]{{36}}/$"))
    return Task.objects.get(pk=operator.url.rstrip("/").rsplit("/", 1)[1])
