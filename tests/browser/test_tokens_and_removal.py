"""Issue 15 items 6 and 8 in a real browser: input-request cards told apart, API tokens on a page, removing a
server; at a desktop's size and a phone's (screenshots of each, for people to look at)."""

import re

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.api.models import ApiToken
from taskhub.api.tokens import user_for_token
from taskhub.mcp.client import TaskCreated
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.approval_fixtures import set_approver_groups
from tests.browser_fixtures import PHONE, screenshot, sign_in
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot

REMOTE_ID = "3f2b9c1e-5d4a-4e8b-9a7c-1b2c3d4e5f60"
HASHES = ("5d41402abc4b2a76b9719d911017c592", "7d793037a0760186574b0282f2f435e7", "9e107d9d372bb6826bd81d3542a419d6")
STEPS = ("Approve the database migration", "Approve the deploy to staging", "Approve the deploy to production")


@pytest.fixture
def alpha():
    server = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    with_tools(server, "release")
    return server


def test_three_requests_of_one_task_are_told_apart(daphne_server, new_page, alpha):
    group = Group.objects.create(name="alpha-approvers")
    set_approver_groups(alpha, [group])
    make_user("amy", APPROVERS, "alpha-approvers", password=TEST_PASSWORD)
    task = services.launch(server=alpha, tool="release", arguments={}, user=None)
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=REMOTE_ID)))
    fields = {"ok": {"type": "boolean", "title": "Looks right"}, "note": {"type": "string", "title": "Note"}}
    asks = {
        f"{REMOTE_ID}:{digest}": {
            "method": "elicitation/create",
            "params": {"message": f"{step}?", "requestedSchema": {"type": "object", "properties": fields}},
        }
        for step, digest in zip(STEPS, HASHES, strict=True)
    }
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", task_id=REMOTE_ID, inputRequests=asks))

    for name, size in (("desktop", None), ("phone", PHONE)):
        page = new_page()
        if size:
            page.set_viewport_size(size)
        sign_in(page, daphne_server.url, "amy", TEST_PASSWORD)
        page.goto(f"{daphne_server.url}/inbox/")
        cards = page.locator("article.ir-card")
        expect(cards).to_have_count(3)
        for number, (step, digest) in enumerate(zip(STEPS, HASHES, strict=True)):
            card = cards.nth(number)
            # Each card leads with what is asked, then the fields it wants; the keys differ where they differ.
            expect(card.get_by_role("heading")).to_have_text(f"server says: {step}?")
            expect(card.locator(".ir-asks")).to_have_text("asks for Note, Looks right")  # in the form's order
            expect(card.locator(".ir-ordinal")).to_have_text(f"request {number + 1} of 3")
            expect(card.locator(".ir-key")).to_have_text(f"…{digest[-12:]}")
            expect(card.locator(".ir-key")).to_have_attribute("title", f"{REMOTE_ID}:{digest}")
        screenshot(page, f"inbox-cards-{name}")


def test_a_person_creates_sees_once_and_revokes_a_token(daphne_server, new_page):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    base = daphne_server.url
    page = new_page()
    sign_in(page, base, "olga", TEST_PASSWORD)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="API tokens").click()
    expect(page.get_by_role("heading", name="API tokens", level=1)).to_be_visible()
    page.get_by_label("Name").fill("CI pipeline")
    page.get_by_label("Expires").select_option(label="in 30 days")
    page.get_by_role("button", name="Create token").click()
    created = page.get_by_role("status").filter(has_text="Token “CI pipeline” created")
    expect(created).to_contain_text("shown only this once")
    secret = page.locator("#token-secret").inner_text()
    assert user_for_token(secret).username == "olga"
    row = page.get_by_role("row", name=re.compile("CI pipeline"))
    expect(row).to_contain_text("never")  # not used yet
    expect(row).to_contain_text("in 4 weeks")
    screenshot(page, "tokens-created")

    # Reloading the page (a GET after the redirect) creates no second token and does not show the secret again.
    page.reload()
    expect(page.get_by_role("heading", name="API tokens", level=1)).to_be_visible()
    assert secret not in page.content()
    assert ApiToken.objects.filter(user__username="olga").count() == 1
    page.set_viewport_size(PHONE)
    screenshot(page, "tokens-phone")
    page.get_by_role("link", name="Revoke CI pipeline").click()
    expect(page.get_by_role("heading", name="Revoke “CI pipeline”?")).to_be_visible()
    assert user_for_token(secret).username == "olga"  # asking revokes nothing
    screenshot(page, "tokens-revoke-confirm")
    page.get_by_role("button", name="Revoke CI pipeline").click()
    expect(page.locator("main").get_by_role("status").first).to_contain_text("Revoked the token “CI pipeline”")
    expect(page.get_by_role("row", name=re.compile("CI pipeline"))).to_contain_text("revoked")
    assert user_for_token(secret) is None


def test_an_admin_removes_a_server_after_confirming_and_its_task_stays_readable(daphne_server, new_page, alpha):
    make_user("alex", ADMINS, password=TEST_PASSWORD)
    task = services.launch(server=alpha, tool="release", arguments={}, user=None)
    services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=REMOTE_ID)))
    base = daphne_server.url
    page = new_page()
    sign_in(page, base, "alex", TEST_PASSWORD)
    page.goto(f"{base}/servers/{alpha.pk}/")
    page.get_by_role("link", name="Remove…").click()
    expect(page.get_by_role("heading", name="Remove alpha?")).to_be_visible()
    expect(page.get_by_role("listitem").filter(has_text="no longer polled")).to_contain_text("1 live task")
    screenshot(page, "servers-remove-confirm")
    page.get_by_label(re.compile("Type the server's name")).fill("alpha")
    page.get_by_role("button", name="Remove alpha").click()
    expect(page).to_have_url(f"{base}/servers/")
    expect(page.locator("main").get_by_role("status").first).to_contain_text("Server alpha removed.")
    expect(page.get_by_role("table")).to_have_count(0)
    expect(page.get_by_text("1 removed server")).to_be_visible()
    assert Server.objects.get(pk=alpha.pk).removed_at is not None

    page.goto(f"{base}/tasks/{task.pk}/")
    expect(page.get_by_role("heading", level=1)).to_have_text("release @ alpha")
    expect(page.get_by_role("status").filter(has_text="Server removed")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    page.set_viewport_size(PHONE)
    screenshot(page, "task-of-removed-server-phone")
