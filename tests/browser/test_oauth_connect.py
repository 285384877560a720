"""In a real browser (issue 33 item 1): an admin adds a server protected by a real authorization server (the demo MCP
server behind tests/oauth_server.py), a worker's discovery meets its 401 challenge and the page says it needs
authorization; Connect takes the browser to the authorization server (which approves at once) and back to taskhub's
callback; the worker then discovers the server's tools with the token taskhub kept."""

import re

import pytest
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS
from taskhub.servers.models import Server
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import sign_in
from tests.demo_process import DemoServer
from tests.oauth_server import AuthorizationServer
from tests.stack_fixtures import Workers, worker_environment

pytestmark = pytest.mark.slow

LATE_MS = 30_000


@pytest.fixture
def protected_demo():
    with DemoServer() as demo:
        server = AuthorizationServer(upstream=demo.url)
        server.start()
        yield server
        server.stop()


@pytest.fixture
def workers(transactional_db):
    workers = Workers(worker_environment())
    try:
        yield workers
    finally:
        workers.stop_all()


def test_an_admin_connects_a_server_behind_oauth_in_the_browser(daphne_server, new_page, protected_demo, workers):
    base = daphne_server.url
    workers.start("oauth-connect")
    make_user("alex", ADMINS, password=TEST_PASSWORD)

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
