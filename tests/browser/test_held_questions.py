"""Issue 32 in the browser: the official reference server, @modelcontextprotocol/server-everything, registered twice
(over stdio, its process held by the worker, and over Streamable HTTP) and driven through the whole stack, every
answer given by a person in the inbox.

Each of its tools runs once over each transport, launched from the launch page: `trigger-elicitation-request` (a
classic `elicitation/create` of every field type while its tools/call waits: the card is filled with the form's
defaults, the person types a name and an email), `trigger-url-elicitation` (a URL-mode question: the card shows the
link, never opened by taskhub), `simulate-research-query` as a 2025-11-25 task with and without `ambiguous` (its
question arrives through tasks/result and the person's choice ends up in its report), `trigger-sampling-request`
(the person writes the model's message), `get-roots-list` (the roots the admin configured) and
`trigger-long-running-operation` (its steps move a bar on the task page, pushed while the call runs). Each task page
then shows what the server answered.
"""

from __future__ import annotations

import re
import shutil

import pytest
from playwright.sync_api import Page, expect

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.servers.discovery import discover_and_record
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import needs_redis, screenshot, sign_in
from tests.helpers import wait_until
from tests.stack_fixtures import Workers, in_own_thread, worker_environment

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TASK_URL = re.compile(r".*/tasks/([0-9a-f-]{36})/$")
ANSWERED = re.compile("answered by you|delivered")
ROOTS = [{"uri": "file:///srv/repo", "name": "Repository"}]


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


def launch(page: Page, base_url: str, server: Server, tool: str, *, fill=(), check=()) -> str:
    """Launch `tool` of `server` from its launch page with these fields; the task page's URL."""
    page.goto(f"{base_url}/launch/{server.pk}/{tool}/")
    for label, value in fill:
        page.get_by_label(re.compile(rf"^\s*{label}\b")).fill(value)
    for label in check:
        page.get_by_label(re.compile(rf"^\s*{label}\b")).check()
    page.get_by_role("button", name="Launch", exact=True).click()
    expect(page).to_have_url(TASK_URL)
    return page.url


def test_a_person_answers_every_question_of_the_reference_server_over_stdio_and_http_and_sees_its_progress_live(
    new_page, session_daphne, worker, everything, over_http
):
    admin = make_user("ada", ADMINS, password=TEST_PASSWORD)
    make_user("arun", APPROVERS, password=TEST_PASSWORD)
    node = shutil.which("node") or "node"
    # Enough slots for every question to be held at once on each server.
    over_stdio = in_own_thread(
        create_server,
        name="everything",
        transport="stdio",
        command=node,
        args=[everything, "stdio"],
        user=admin,
        roots=ROOTS,
        max_concurrent_jobs=8,
        discover_in_background=True,
    )
    # Made before the inbox opens: a server made in this process (not a web process) reaches no open socket.
    streamable = in_own_thread(
        create_server,
        name="everything-http",
        transport="http",
        url=over_http,
        user=admin,
        roots=ROOTS,
        max_concurrent_jobs=8,
    )
    in_own_thread(discover_and_record, server=streamable, user=admin)
    wait_until(
        lambda: in_own_thread(Server.objects.filter(pk=over_stdio.pk, discovered_at__isnull=False).exists),
        timeout=60,
        what="the reference server over stdio discovered by the worker",
    )
    servers = (over_stdio, streamable)

    approver = new_page()
    sign_in(approver, session_daphne.url, "arun", TEST_PASSWORD)
    approver.goto(f"{session_daphne.url}/inbox/")
    expect(approver.locator("#live-indicator")).to_have_attribute("data-state", "live")
    operator = new_page()
    sign_in(operator, session_daphne.url, "ada", TEST_PASSWORD)

    launches = {
        "form": ("trigger-elicitation-request", {}),
        "url": ("trigger-url-elicitation", {"fill": [("url", "https://example.com/authorize?flow=7")]}),
        "asks": ("simulate-research-query", {"fill": [("topic", "python")], "check": ["ambiguous"]}),
        "plain": ("simulate-research-query", {"fill": [("topic", "tides")]}),
        "sampling": ("trigger-sampling-request", {"fill": [("prompt", "Say hi")]}),
        "roots": ("get-roots-list", {}),
    }
    ends = {
        "form": (
            "User provided the requested information!",
            "- Name: Ada Lovelace",
            "- Email: ada@example.org",
            "- Favorite Integer: 42",
            "Monica",
        ),
        "url": ("User completed the URL elicitation flow",),
        "asks": ("Research Report: python (comedy)",),
        "plain": ("Research Report: tides",),
        "sampling": ("Hi, written by a person for {name}",),
        "roots": ("1. Repository", "file:///srv/repo"),
    }
    tasks: dict[tuple[str, str], str] = {}
    checked: set[tuple[str, str]] = set()

    def start(server: Server, kind: str) -> None:
        tool, fields = launches[kind]
        tasks[server.name, kind] = launch(operator, session_daphne.url, server, tool, **fields)

    def card(server: Server, asking: str):
        from_server = approver.locator(".ir-server", has_text=re.compile(rf"^{re.escape(server.name)}$"))
        found = approver.locator("article.ir-card").filter(has_text=asking).filter(has=from_server)
        expect(found).to_be_visible(timeout=30_000)  # pushed: the inbox is never reloaded
        # By its id: once answered, the card no longer shows its form (nor, for sampling, the words found by).
        return approver.locator(f"#{found.get_attribute('id')}")

    def answered(found) -> None:
        # Before the next card is touched: the answered card, swapped smaller, moves the cards below it, and a click
        # on one of them as it moves lands elsewhere (a CI run lost the next card's Accept that way).
        expect(found).to_contain_text(ANSWERED)

    def answer(server: Server, kind: str) -> None:
        if kind == "form":
            form = card(server, "Please provide inputs for the following fields:")
            expect(form).to_contain_text("the call waits until")
            expect(form.get_by_role("spinbutton", name=re.compile("^Integer"))).to_have_value("42")  # the defaults
            form.get_by_role("textbox", name=re.compile(r"^String\s+required")).fill("Ada Lovelace")
            form.get_by_role("textbox", name=re.compile("^String with email format")).fill("ada@example.org")
            if server is over_stdio:
                screenshot(approver, "held-question-inbox")
            form.get_by_role("button", name="Accept").click()
            answered(form)
        elif kind == "url":
            link = card(server, "Please open the link to complete this action.")
            expect(link.locator(".ir-host").first).to_have_text("example.com")
            expect(link.locator(".ir-url-text")).to_have_text("https://example.com/authorize?flow=7")
            link.get_by_role("button", name="Accept").click()
            answered(link)
        elif kind == "asks":
            research = card(server, "could have multiple interpretations")
            research.get_by_label(re.compile("^Clarification")).select_option(label="Monty Python comedy group")
            research.get_by_role("button", name="Accept").click()
            answered(research)
        elif kind == "sampling":
            sampling = card(server, "asks for a language model's message")
            expect(sampling).to_contain_text("You are a helpful test server.")
            sampling.get_by_label(re.compile("^Reply")).fill(f"Hi, written by a person for {server.name}")
            if server is over_stdio:
                screenshot(approver, "sampling-inbox")
            sampling.get_by_role("button", name="Send reply").click()
            answered(sampling)

    def ended_as_meant(server: Server, kind: str) -> None:
        checked.add((server.name, kind))
        operator.goto(tasks[server.name, kind])
        for shown in ends[kind]:
            expect(operator.locator("body")).to_contain_text(shown.format(name=server.name), timeout=30_000)
        if server is over_stdio and kind in ("form", "asks"):
            screenshot(operator, {"form": "held-question-result", "asks": "session-task-result"}[kind])

    # Over Streamable HTTP a question comes on the event stream of the call it belongs to: every tool at once.
    for kind in launches:
        start(streamable, kind)
    # Over stdio a classic question names no call: while two calls wait, it cannot be told whose it is (README), so
    # the calls that ask run one at a time; a 2025-11-25 task's question names its task, so tasks run beside them.
    for kind in ("asks", "plain", "form"):
        start(over_stdio, kind)
    for server, kind in (
        (over_stdio, "form"),
        (over_stdio, "asks"),
        *((streamable, kind) for kind in ("form", "url", "asks", "sampling")),
    ):
        answer(server, kind)
    ended_as_meant(over_stdio, "form")
    for kind in ("url", "sampling", "roots"):
        start(over_stdio, kind)
        answer(over_stdio, kind)
        ended_as_meant(over_stdio, kind)
    for server in servers:
        for kind in launches:
            if (server.name, kind) not in checked:
                ended_as_meant(server, kind)

    # A long call over each transport: its steps move a bar on its task page while it runs.
    watchers = {server.name: new_page() for server in servers}
    for server in servers:
        sign_in(watchers[server.name], session_daphne.url, "ada", TEST_PASSWORD)
    for server in servers:
        launch(
            watchers[server.name],
            session_daphne.url,
            server,
            "trigger-long-running-operation",
            fill=[("duration", "8"), ("steps", "8")],
        )
    for server in servers:
        page = watchers[server.name]
        bar = page.locator(".task-progress progress")
        expect(bar).to_have_attribute("max", "8", timeout=30_000)
        expect(page.locator(".task-progress")).to_contain_text(re.compile(r"[1-7] of 8"))
        if server is over_stdio:
            screenshot(page, "call-progress")
    for page in watchers.values():
        expect(page.locator("body")).to_contain_text("Long running operation completed", timeout=30_000)
        expect(page.locator(".task-progress progress")).to_have_count(0)
