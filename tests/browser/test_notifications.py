"""The notification preferences page in a real browser: reached from the user menu, changed, saved; and a digest's
link opening the request's card (issue 16)."""

import re
from html import escape

from django.core import mail
from playwright.sync_api import expect

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.approvals.models import NotificationPreferences
from taskhub.approvals.notifications import digest
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import screenshot, sign_in
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot


def test_a_person_chooses_which_events_reach_them_by_mail(daphne_server, page, console_errors):
    ada = make_user("ada", APPROVERS, OPERATORS, password=TEST_PASSWORD)
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.get_by_role("link", name="Notifications").click()
    expect(page.get_by_role("heading", name="Notifications", level=1)).to_be_visible()

    waits = page.get_by_role("checkbox", name="A request waits for me")
    finished = page.get_by_role("checkbox", name="A task I launched finished")
    expect(waits).to_be_checked()  # the defaults: everything about requests on, finished tasks off
    expect(page.get_by_role("checkbox", name="Its answer deadline is near")).to_be_checked()
    expect(finished).not_to_be_checked()
    expect(finished).to_have_accessible_description(
        "Completed, failed, cancelled, expired or lost. Off unless you turn it on."
    )

    page.get_by_label("Email address").fill("ada@example.com")
    page.get_by_role("checkbox", name="A default was applied").uncheck()
    finished.check()
    screenshot(page, "notification-preferences")
    page.get_by_role("button", name="Save my choices").click()

    expect(page.get_by_role("status").filter(has_text="Your notification choices are saved.")).to_be_visible()
    expect(page.get_by_label("Email address")).to_have_value("ada@example.com")
    expect(page.get_by_role("checkbox", name="A default was applied")).not_to_be_checked()
    expect(page.get_by_role("checkbox", name="A task I launched finished")).to_be_checked()
    preferences = NotificationPreferences.objects.get(user=ada)
    assert (preferences.request_waiting, preferences.default_applied, preferences.task_finished) == (True, False, True)

    page.get_by_label("Email address").fill("not an address")
    with console_errors.expect(page, "400"):  # the form comes back refused, with a 400
        page.get_by_role("button", name="Save my choices").click()
        expect(page.get_by_role("alert")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("Your choices were not saved")
    expect(page.get_by_text("Enter a valid email address.")).to_be_visible()
    ada.refresh_from_db()
    assert ada.email == "ada@example.com"


def test_a_digests_link_opens_the_requests_card(daphne_server, page, settings):
    settings.TASKHUB_BASE_URL = daphne_server.url
    ada = make_user("ada", APPROVERS, email="ada@example.com", password=TEST_PASSWORD)
    alpha = with_tools(create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None), "x")
    task = services.launch(server=alpha, tool="x", arguments={}, user=None)
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id="r-1")))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean", "title": "Looks right"}}}
    ask = {"method": "elicitation/create", "params": {"message": "Ship build 4127?", "requestedSchema": schema}}
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", task_id="r-1", inputRequests={"q": ask}))
    request = InputRequest.objects.get(task=task)

    assert digest.send_digest(user_id=ada.pk) == "mailed 1 event(s) to ada"  # what the worker's job does
    (message,) = mail.outbox
    link = re.search(rf"{re.escape(daphne_server.url)}/tasks/\S+#ir-\d+", message.body).group(0)
    assert link.endswith(f"#ir-{request.pk}")
    # The mail as a mail program shows it (its HTML part), for the README.
    html = next(content for content, mimetype in message.alternatives if mimetype == "text/html")
    page.set_viewport_size({"width": 640, "height": 220})
    page.set_content(f"<p style='font-family:sans-serif'><b>Subject:</b> {escape(message.subject)}</p>{html}")
    expect(page.get_by_text("Ship build 4127?")).to_be_visible()
    screenshot(page, "notification-digest")

    page.set_viewport_size({"width": 1280, "height": 800})
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    page.goto(link)
    card = page.locator(f"#ir-{request.pk}")
    expect(card.get_by_role("heading")).to_have_text("server says: Ship build 4127?")
    expect(card).to_be_in_viewport()
