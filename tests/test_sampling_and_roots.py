"""What the reference server asks of the client itself (issue 32, item 2), through the whole stack with
@modelcontextprotocol/server-everything: `sampling/createMessage` in the middle of a call, written by a person in the
inbox (or declined, or refused outright by the server's setting), and `roots/list` answered from the roots an admin
set on the server, the server told when they change."""

from __future__ import annotations

import shutil

import pytest
from django.test import Client

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.mcp.cli import EXIT_USAGE
from taskhub.servers.discovery import discover_and_record
from taskhub.servers.forms import ServerForm
from taskhub.servers.services import update_server
from taskhub.tasks import services
from taskhub.tasks.answers import validate_response
from taskhub.tasks.errors import AnswerRejected
from taskhub.tasks.input_cards import card_for, response_from_post
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskStatus
from taskhub.tasks.sampling_cards import PERSON_AS_MODEL
from tests.account_fixtures import make_user
from tests.everything_fixtures import register_everything, run_cli
from tests.helpers import wait_until
from tests.stack_fixtures import in_own_thread

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SAMPLING_TOOL = "trigger-sampling-request"
ROOTS_TOOL = "get-roots-list"


def ended(task: Task) -> Task:
    return wait_until(
        lambda: (found := Task.objects.get(pk=task.pk)).is_terminal and found, timeout=60, what="the call to end"
    )


def text_of(task: Task) -> str:
    return "\n".join(part.get("text", "") for part in (task.result or {}).get("content", []))


def held_request(task: Task) -> InputRequest:
    return wait_until(
        lambda: InputRequest.objects.filter(task=task, state=InputRequestState.OPEN).first(),
        timeout=60,
        what="the server's request in the inbox",
    )


def test_over_stdio_a_person_writes_the_models_message_and_the_roots_are_the_admins_told_when_they_change(
    workers, everything
):
    admin, approver = make_user("ada", ADMINS), make_user("april", APPROVERS)
    server = register_everything(admin, everything, expect_tool=SAMPLING_TOOL)
    assert ROOTS_TOOL in {tool["name"] for tool in server.tools}
    server = update_server(server=server, user=admin, roots=[{"uri": "file:///srv/repo", "name": "Repository"}])
    workers.start("holder")

    asked = services.launch(server=server, tool=SAMPLING_TOOL, arguments={"prompt": "Say hi"}, user=admin)
    request = held_request(asked)
    assert request.method == "sampling/createMessage" and request.held_by == "holder"
    card = card_for(request, approver)
    assert card.kind == "sampling" and card.can_decline
    assert card.sampling.system_prompt == "You are a helpful test server."
    assert card.sampling.messages[0].role == "user" and "Say hi" in card.sampling.messages[0].text
    assert ("max tokens", "100") in card.sampling.limits
    with pytest.raises(AnswerRejected, match="Write the reply"):
        response_from_post(card, {"action": "accept", "reply": "  "})
    page = Client()
    page.force_login(approver)
    shown = page.get("/inbox/").text
    assert "You are a helpful test server." in shown and "Send reply" in shown
    reply = response_from_post(card, {"action": "accept", "reply": "Hi from a person"})
    services.answer_input(input_request=request, response=reply, user=approver)
    asked = ended(asked)
    assert asked.status == TaskStatus.COMPLETED, (asked.status, asked.error)
    assert "Hi from a person" in text_of(asked) and PERSON_AS_MODEL in text_of(asked)

    listed = ended(services.launch(server=server, tool=ROOTS_TOOL, arguments={}, user=admin))
    assert "1. Repository\n   URI: file:///srv/repo" in text_of(listed), text_of(listed)
    # A change reaches the running process without a restart: roots/list_changed, and the server asks again.
    update_server(server=server, user=admin, roots=[{"uri": "file:///srv/docs", "name": "Docs"}])

    def relisted() -> str | None:
        text = text_of(ended(services.launch(server=server, tool=ROOTS_TOOL, arguments={}, user=admin)))
        return text if "file:///srv/docs" in text else None

    assert "1. Docs" in wait_until(relisted, timeout=30, what="the new roots listed by the server")


def test_over_http_a_declined_sampling_request_is_refused_roots_are_listed_and_a_declining_server_is_not_offered_it(
    workers, everything, over_http
):
    admin, approver = make_user("ada", ADMINS), make_user("april", APPROVERS)
    server = register_everything(admin, everything, url=over_http, expect_tool=SAMPLING_TOOL)
    workers.start("holder")
    asked = services.launch(server=server, tool=SAMPLING_TOOL, arguments={"prompt": "Say hi"}, user=admin)
    services.answer_input(input_request=held_request(asked), response={"action": "decline"}, user=approver)
    asked = ended(asked)
    assert asked.status == TaskStatus.COMPLETED and asked.result["isError"], asked.result
    assert "refused" in text_of(asked), text_of(asked)

    # Over HTTP each job opens its own session, which answers roots/list with the roots set at the time.
    update_server(server=server, user=admin, roots=[{"uri": "file:///srv/http", "name": "Over HTTP"}])
    listed = ended(services.launch(server=server, tool=ROOTS_TOOL, arguments={}, user=admin))
    assert "1. Over HTTP\n   URI: file:///srv/http" in text_of(listed), text_of(listed)

    update_server(server=server, user=admin, sampling_declined=True)
    server.refresh_from_db()
    in_own_thread(discover_and_record, server=server, user=admin)
    server.refresh_from_db()
    assert SAMPLING_TOOL not in {tool["name"] for tool in server.tools}  # not declared: the server does not offer it


def test_roots_an_admin_types_are_checked_and_a_task_sampling_request_cannot_be_declined():
    form = ServerForm(
        data={"name": "x", "transport": "stdio", "command": "node", "roots": "file:///a A\nhttp://b B", "enabled": "on"}
    )
    assert not form.is_valid() and "file:// URI" in str(form.errors["roots"])
    form = ServerForm(data={"name": "x", "transport": "stdio", "command": "node", "roots": "file:///a  Alpha one\n"})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["roots"] == [{"uri": "file:///a", "name": "Alpha one"}]

    with pytest.raises(AnswerRejected, match="cannot be declined"):
        validate_response(method="sampling/createMessage", params={}, response={"action": "decline"})
    assert validate_response(method="sampling/createMessage", params={}, response={"action": "decline"}, held=True) == {
        "action": "decline"
    }
    with pytest.raises(AnswerRejected, match="role assistant"):
        validate_response(
            method="sampling/createMessage",
            params={},
            response={"role": "user", "content": {"type": "text", "text": "x"}, "model": "m"},
        )


def test_the_cli_answers_sampling_from_its_answers_and_roots_list_from_its_roots(everything):
    stdio = f"{shutil.which('node') or 'node'} {everything} stdio"
    reply = '*={"role":"assistant","content":{"type":"text","text":"hello from the cli"},"model":"me"}'
    sampled = run_cli("call", "--stdio", stdio, SAMPLING_TOOL, "--args", '{"prompt":"hi"}', "--answer", reply)
    assert sampled.returncode == 0, sampled.stderr
    assert "hello from the cli" in sampled.stdout
    listed = run_cli("call", "--stdio", stdio, ROOTS_TOOL, "--root", "file:///srv/a=Alpha", "--root", "file:///srv/b")
    assert listed.returncode == 0, listed.stderr
    assert (
        "1. Alpha\n   URI: file:///srv/a" in listed.stdout and "2. Unnamed Root\n   URI: file:///srv/b" in listed.stdout
    )
    refused = run_cli("call", "--stdio", stdio, ROOTS_TOOL, "--root", "http://nope")
    assert refused.returncode == EXIT_USAGE and "--root must be a file:// URI" in refused.stderr
