"""Issue 32 item 1: a question a server asks in the middle of a call (a classic `elicitation/create`) reaches a person.

The official reference server, @modelcontextprotocol/server-everything (scripts/server_everything.sh installs the
pinned version), is driven through `manage.py worker` subprocesses and Postgres, over stdio and Streamable HTTP: its
`trigger-elicitation-request` asks for a form of every field type while its tools/call waits. The question opens as
an input request held by the worker holding the call; a person's answer (the inbox's service) goes back as the
JSON-RPC response on that session, and the server's result says what it got. A wait that runs out tells the server
"cancel"; a worker killed with the question open closes it as lost, and nothing is sent. A URL-mode question whose
interaction the server says completed (tests/url_flow_server.py) closes with that reason.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.audit.models import AuditEvent
from taskhub.mcp import schema_fields
from taskhub.servers.discovery import discover_and_record
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import InputNoLongerOpen
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskStatus
from taskhub.tasks.services import held_questions
from tests.account_fixtures import make_user
from tests.everything_fixtures import register_everything
from tests.helpers import wait_until
from tests.stack_fixtures import in_own_thread

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOOL = "trigger-elicitation-request"
URL_FLOW_SERVER = Path(__file__).with_name("url_flow_server.py")
# What a person fills in: every field type of the form (the server requires only the name).
FORM = {
    "name": "Ada Lovelace",
    "check": True,
    "firstLine": "It was a dark and stormy night.",
    "email": "ada@example.org",
    "homepage": "https://example.org/ada",
    "birthdate": "1815-12-10",
    "integer": 7,
    "number": 2.5,
    "untitledSingleSelectEnum": "Joey",
    "untitledMultipleSelectEnum": ["Piano", "Violin"],
    "titledSingleSelectEnum": "hero-3",
    "titledMultipleSelectEnum": ["fish-2"],
    "legacyTitledEnum": "pet-2",
}


def registered(admin, everything: str, *, url: str | None = None) -> Server:
    return register_everything(admin, everything, url=url, expect_tool=TOOL)


def held_request(task: Task) -> InputRequest:
    return wait_until(
        lambda: InputRequest.objects.filter(task=task, state=InputRequestState.OPEN).exclude(held_by="").first(),
        timeout=60,
        what="the server's question in the inbox",
    )


def ended(task: Task) -> Task:
    return wait_until(
        lambda: (found := Task.objects.get(pk=task.pk)).is_terminal and found, timeout=60, what="the call to end"
    )


def result_text(task: Task) -> str:
    return "\n".join(part.get("text", "") for part in task.result["content"])


def test_classic_elicitations_over_stdio_form_and_url_are_answered_by_a_person_and_reach_the_server(
    workers, everything, tmp_path
):
    admin, approver = make_user("ada", ADMINS), make_user("april", APPROVERS)
    server = registered(admin, everything)
    workers.start("holder")
    task = services.launch(server=server, tool=TOOL, arguments={}, user=admin)

    request = held_request(task)
    assert request.held_by == "holder" and request.held_until is not None
    assert request.method == "elicitation/create"
    assert request.params["message"] == "Please provide inputs for the following fields:"
    form = schema_fields.build_fields(request.params["requestedSchema"], schema_fields.ELICITATION)
    assert form.renderable, form.problem  # every field type of the form can be shown to a person
    assert not AuditEvent.objects.filter(task_id=task.pk, action="task.protocol_error").exists()

    services.answer_input(input_request=request, response={"action": "accept", "content": FORM}, user=approver)
    task = ended(task)
    assert task.status == TaskStatus.COMPLETED, (task.status, task.error)
    text = result_text(task)
    assert "✅ User provided the requested information!" in text
    for line in ("- Name: Ada Lovelace", "- Email: ada@example.org", "- Favorite Integer: 7", "- Birthdate: 1815"):
        assert line in text, text
    assert '"untitledMultipleSelectEnum": [\n      "Piano",\n      "Violin"\n    ]' in text, text
    request.refresh_from_db()
    assert request.state == InputRequestState.DELIVERED
    trail = list(AuditEvent.objects.filter(task_id=task.pk).values_list("action", flat=True))
    assert trail.count("task.input_requested") == trail.count("input.answered") == trail.count("input.delivered") == 1

    # URL mode: the person is shown the link (never opened by taskhub) and consents.
    url = "https://example.com/authorize?flow=42"
    consent = services.launch(server=server, tool="trigger-url-elicitation", arguments={"url": url}, user=admin)
    request = held_request(consent)
    assert (request.params["mode"], request.params["url"]) == ("url", url)
    services.answer_input(input_request=request, response={"action": "accept"}, user=approver)
    consent = ended(consent)
    assert consent.status == TaskStatus.COMPLETED, (consent.status, consent.error)
    assert '"action": "accept"' in result_text(consent), result_text(consent)

    # A server that says the interaction at the link completed (notifications/elicitation/complete) before anyone
    # answered: the card closes with that reason and the server hears "accept" (the reference server never says it).
    flow = create_server(
        name="url flow", transport="stdio", command=sys.executable, args=[str(URL_FLOW_SERVER)], user=admin
    )
    in_own_thread(discover_and_record, server=flow, user=admin)
    done_file = tmp_path / "signed-in"
    signing_in = services.launch(
        server=flow, tool="sign_in", arguments={"url": url, "done_file": str(done_file)}, user=admin
    )
    request = held_request(signing_in)
    assert request.params["elicitationId"].startswith("flow-")
    done_file.touch()
    signing_in = ended(signing_in)
    assert result_text(signing_in) == "action: accept", result_text(signing_in)
    request.refresh_from_db()
    assert (request.state, request.closed_reason) == (InputRequestState.SUPERSEDED, held_questions.COMPLETED_AT_LINK)


def test_over_http_a_decline_reaches_the_server_and_a_wait_that_runs_out_tells_it_cancel(
    workers, everything, over_http
):
    admin, approver = make_user("ada", ADMINS), make_user("april", APPROVERS)
    server = registered(admin, everything, url=over_http)
    workers.start("holder")

    declined = services.launch(server=server, tool=TOOL, arguments={}, user=admin)
    services.answer_input(
        input_request=held_request(declined), response={"action": "decline"}, user=approver, comment="not today"
    )
    assert "❌ User declined to provide the requested information." in result_text(ended(declined))

    Server.objects.filter(pk=server.pk).update(question_wait_seconds=2)  # below the form's minimum, for the test
    unanswered = services.launch(server=server, tool=TOOL, arguments={}, user=admin)
    request = held_request(unanswered)
    assert "⚠️ User cancelled the elicitation dialog." in result_text(ended(unanswered))
    request.refresh_from_db()
    assert request.state == InputRequestState.SUPERSEDED
    assert request.closed_reason == held_questions.WAIT_RAN_OUT.format(wait="2 s")


def test_a_worker_killed_with_a_question_open_closes_it_as_lost_within_15_s_and_sends_nothing(
    production_timed_workers, everything
):
    workers = production_timed_workers  # the heartbeat and stalled times of production: the 15 s are theirs
    admin = make_user("ada", ADMINS)
    server = registered(admin, everything)
    workers.start("east")
    workers.start("west")
    task = services.launch(server=server, tool=TOOL, arguments={}, user=admin)
    request = held_request(task)
    holder = workers.processes[request.held_by]
    holder.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    holder.wait(10)

    closed = wait_until(
        lambda: (found := InputRequest.objects.get(pk=request.pk)).state == InputRequestState.SUPERSEDED and found,
        timeout=15 - (time.monotonic() - killed),
        what="the question closed as lost within 15 s of the kill",
    )
    assert closed.closed_reason == held_questions.WORKER_GONE
    with pytest.raises(InputNoLongerOpen):
        services.answer_input(input_request=closed, response={"action": "decline"}, user=admin)
    # The call died with its worker: its outcome is unknown, and it is never sent again.
    task = wait_until(
        lambda: (found := Task.objects.get(pk=task.pk)).status == TaskStatus.LAUNCH_UNKNOWN and found,
        timeout=60,
        what="the launch outcome unknown",
    )
    assert AuditEvent.objects.filter(task_id=task.pk, action="task.launch_sent").count() == 1
