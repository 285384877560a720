"""Issue 32 item 1 in the browser: the official reference server's `trigger-elicitation-request` (a classic
`elicitation/create` of every field type, asked while its tools/call waits) answered by a person in the inbox.

The reference server runs over stdio in the worker that holds its process (tests/everything_fixtures.py); the
approver's inbox gets the card live, filled with the form's defaults; the approver types a name and an email and
accepts; the operator's task page then shows the server's result, every field as sent (defaults included). Then a
long call of the same server (`trigger-long-running-operation`) moves a progress bar on its task page while it runs,
a 2025-11-25 task of it (`simulate-research-query`, ambiguous) asks its question in the inbox and ends with the
person's choice in its report, and its sampling request gets the message a person writes. Last, the same server over
Streamable HTTP asks a URL-mode question (`trigger-url-elicitation`): the card shows the link, the person accepts.
"""

from __future__ import annotations

import re
import shutil

import pytest
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.servers.discovery import discover_and_record
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import needs_redis, screenshot, sign_in
from tests.helpers import wait_until
from tests.stack_fixtures import Workers, in_own_thread, worker_environment

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOOL = "trigger-elicitation-request"
TASK_URL = re.compile(r".*/tasks/([0-9a-f-]{36})/$")


@pytest.fixture
def worker(session_daphne, live_channel_env, django_db_blocker):
    needs_redis(live_channel_env)
    with django_db_blocker.unblock():
        workers = Workers(worker_environment(**live_channel_env))
    try:
        workers.start("held-questions")
        yield
    finally:
        workers.stop_all()


def test_a_person_answers_the_reference_servers_form_in_the_inbox_and_a_long_calls_progress_moves_live(
    new_page, session_daphne, worker, everything, over_http
):
    everything_over_http = over_http
    admin = make_user("ada", ADMINS, password=TEST_PASSWORD)
    make_user("arun", APPROVERS, password=TEST_PASSWORD)
    server = in_own_thread(
        create_server,
        name="everything",
        transport="stdio",
        command=shutil.which("node") or "node",
        args=[everything, "stdio"],
        user=admin,
        discover_in_background=True,
    )
    wait_until(
        lambda: in_own_thread(Server.objects.filter(pk=server.pk, discovered_at__isnull=False).exists),
        timeout=60,
        what="the reference server discovered by the worker",
    )

    # Made before the inbox opens: a server made in this process (not a web process) reaches no open socket.
    over_http = in_own_thread(
        create_server, name="everything-http", transport="http", url=everything_over_http, user=admin
    )
    in_own_thread(discover_and_record, server=over_http, user=admin)

    approver = new_page()
    sign_in(approver, session_daphne.url, "arun", TEST_PASSWORD)
    approver.goto(f"{session_daphne.url}/inbox/")
    expect(approver.locator("#live-indicator")).to_have_attribute("data-state", "live")

    operator = new_page()
    sign_in(operator, session_daphne.url, "ada", TEST_PASSWORD)
    operator.goto(f"{session_daphne.url}/launch/")
    operator.get_by_role("link", name=re.compile(rf"\b{re.escape(TOOL)}\b")).first.click()
    operator.get_by_role("button", name="Launch", exact=True).click()
    expect(operator).to_have_url(TASK_URL)

    card = approver.locator("article.ir-card").filter(has_text="Please provide inputs for the following fields:")
    expect(card).to_be_visible(timeout=30_000)  # pushed: the inbox was not reloaded
    expect(card).to_contain_text("the call waits until")
    expect(card.get_by_role("spinbutton", name=re.compile("^Integer"))).to_have_value("42")  # the form's defaults
    card.get_by_role("textbox", name=re.compile(r"^String\s+required")).fill("Ada Lovelace")
    card.get_by_role("textbox", name=re.compile("^String with email format")).fill("ada@example.org")
    screenshot(approver, "held-question-inbox")
    card.get_by_role("button", name="Accept").click()
    expect(card).to_contain_text(re.compile("answered by you|delivered"))

    result = operator.locator("body")
    expect(result).to_contain_text("User provided the requested information!", timeout=30_000)
    for shown in ("- Name: Ada Lovelace", "- Email: ada@example.org", "- Favorite Integer: 42", "Monica"):
        expect(result).to_contain_text(shown)
    screenshot(operator, "held-question-result")

    # A long call of the same server: its steps move a bar on the task page, pushed while the call runs.
    operator.goto(f"{session_daphne.url}/launch/")
    operator.get_by_role("link", name=re.compile(r"\btrigger-long-running-operation\b")).first.click()
    operator.get_by_label("duration", exact=False).fill("6")
    operator.get_by_label("steps", exact=False).fill("6")
    operator.get_by_role("button", name="Launch", exact=True).click()
    expect(operator).to_have_url(TASK_URL)
    bar = operator.locator(".task-progress progress")
    expect(bar).to_have_attribute("max", "6", timeout=30_000)
    expect(operator.locator(".task-progress")).to_contain_text(re.compile(r"[1-5] of 6"))
    screenshot(operator, "call-progress")
    expect(operator.locator("body")).to_contain_text("Long running operation completed", timeout=30_000)
    expect(bar).to_have_count(0)

    # A 2025-11-25 task (issue 32 item 3): the research tool runs as a task on its session; its question (related to
    # the task, through tasks/result) reaches the inbox, and the person's choice ends up in its report.
    operator.goto(f"{session_daphne.url}/launch/")
    operator.get_by_role("link", name=re.compile(r"\bsimulate-research-query\b")).first.click()
    operator.get_by_label("topic", exact=False).fill("python")
    operator.get_by_label("ambiguous", exact=False).check()
    operator.get_by_role("button", name="Launch", exact=True).click()
    expect(operator).to_have_url(TASK_URL)
    card = approver.locator("article.ir-card").filter(has_text="could have multiple interpretations")
    expect(card).to_be_visible(timeout=30_000)
    expect(operator.locator("body")).to_contain_text("Requesting clarification", timeout=10_000)
    card.get_by_label(re.compile("^Clarification")).select_option(label="Monty Python comedy group")
    card.get_by_role("button", name="Accept").click()
    expect(operator.locator("body")).to_contain_text("Research Report: python (comedy)", timeout=30_000)
    screenshot(operator, "session-task-result")

    # Sampling (issue 32 item 2): the server asks for a model's message; the person writes it in the inbox.
    operator.goto(f"{session_daphne.url}/launch/")
    operator.get_by_role("link", name=re.compile(r"\btrigger-sampling-request\b")).first.click()
    operator.get_by_label("prompt", exact=False).fill("Say hi")
    operator.get_by_role("button", name="Launch", exact=True).click()
    expect(operator).to_have_url(TASK_URL)
    card = approver.locator("article.ir-card").filter(has_text="asks for a language model's message")
    expect(card).to_be_visible(timeout=30_000)
    expect(card).to_contain_text("You are a helpful test server.")
    card.get_by_label(re.compile("^Reply")).fill("Hi, written by a person")
    screenshot(approver, "sampling-inbox")
    card.get_by_role("button", name="Send reply").click()
    expect(operator.locator("body")).to_contain_text("Hi, written by a person", timeout=30_000)

    # Over Streamable HTTP (the same server, its own session per job): a URL-mode question shows its link, never
    # opened by taskhub; the person's Accept reaches the server, which says the flow completed.
    operator.goto(f"{session_daphne.url}/launch/{over_http.pk}/trigger-url-elicitation/")
    operator.get_by_label(re.compile(r"^url\b")).fill("https://example.com/authorize?flow=7")
    operator.get_by_role("button", name="Launch", exact=True).click()
    expect(operator).to_have_url(TASK_URL)
    card = approver.locator("article.ir-card").filter(has_text="Please open the link to complete this action.")
    expect(card).to_be_visible(timeout=30_000)
    expect(card.locator(".ir-host").first).to_have_text("example.com")
    expect(card.locator(".ir-url-text")).to_have_text("https://example.com/authorize?flow=7")
    card.get_by_role("button", name="Accept").click()
    expect(operator.locator("body")).to_contain_text("User completed the URL elicitation flow", timeout=30_000)
