"""Input-request cards lead with what the server asks and tell a task's requests apart (issue 15 item 6)."""

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from taskhub.accounts.groups import APPROVERS
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.input_cards import card_for, short_key
from taskhub.tasks.models import InputRequest
from tests.account_fixtures import make_user
from tests.approval_fixtures import set_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot

REMOTE_ID = "3f2b9c1e-5d4a-4e8b-9a7c-1b2c3d4e5f60"
HASHES = ("5d41402abc4b2a76b9719d911017c592", "7d793037a0760186574b0282f2f435e7", "9e107d9d372bb6826bd81d3542a419d6")


def asking(message: str, **properties) -> dict:
    return {
        "method": "elicitation/create",
        "params": {"message": message, "requestedSchema": {"type": "object", "properties": properties}},
    }


@pytest.fixture
def three_requests(db):
    server = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    set_approver_groups(server, [Group.objects.create(name="alpha-approvers")])
    with_tools(server, "deploy")
    task = services.launch(server=server, tool="deploy", arguments={}, user=None)
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=REMOTE_ID)))
    fields = {"ok": {"type": "boolean", "title": "Approve"}, "why": {"type": "string", "title": "Reason <b>"}}
    asks = {f"{REMOTE_ID}:{digest}": asking(f"Step {n}: go?\nDetails follow.", **fields) for n, digest in
            enumerate(HASHES, start=1)}  # fmt: skip
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", task_id=REMOTE_ID, inputRequests=asks))
    approver = make_user("ada", APPROVERS, "alpha-approvers")
    return task, approver


def test_a_long_key_is_shown_without_the_task_id_by_its_tail():
    class Task:
        remote_task_id, pk = REMOTE_ID, "0c7d6a1e-0000-4000-8000-000000000000"

    assert short_key(f"{REMOTE_ID}:{HASHES[0]}", task=Task) == "…" + HASHES[0][-12:]
    assert short_key(f"{Task.pk}/approve", task=Task) == "approve"
    assert short_key("approve", task=Task) == "approve"
    assert short_key(f"{REMOTE_ID}x", task=Task) == "…" + f"{REMOTE_ID}x"[-12:]  # no separator: not the id
    assert short_key("", task=Task) == ""


def test_the_card_leads_with_the_message_and_the_field_titles(three_requests):
    _, approver = three_requests
    request = InputRequest.objects.select_related("task__server").order_by("pk").first()
    card = card_for(request, approver)
    assert card.headline == "Step 1: go?"
    assert card.message_says_more  # the second line shows below
    assert card.field_titles == ["Approve", "Reason <b>"]


def test_the_inbox_tells_the_three_requests_of_one_task_apart(three_requests):
    task, approver = three_requests
    client = Client()
    client.force_login(approver)
    page = client.get(reverse("tasks:inbox")).content.decode()
    keys = [f"…{digest[-12:]}</code>" for digest in HASHES]
    assert all(key in page for key in keys), page
    assert all(f"request {n} of 3" in page for n in (1, 2, 3))
    assert page.index("Step 1: go?") < page.index("request 1 of 3") < page.index("Step 2: go?")
    assert "Reason &lt;b&gt;" in page and "Reason <b>" not in page  # the server's titles are escaped
    # The task page numbers them too.
    page = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert all(f"request {n} of 3" in page for n in (1, 2, 3))
