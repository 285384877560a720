"""Issue 30, item 2: the approval rules fail closed. When taskhub.approvals has not registered them (a start-up
problem), nobody may answer anything and no tool runs: every launch waits at a gate nobody may pass, and the
refusal says why. Before, the registry fell back to permissive defaults (every approver, self-approval, no gate)."""

import pytest
from django.contrib.auth.models import Group

from taskhub.accounts import permissions
from taskhub.accounts.groups import APPROVERS
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import PolicyRefused
from taskhub.tasks.models import GATE_KEY, InputRequest, InputRequestState, Task, TaskStatus
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools

FORM = {
    "method": "elicitation/create",
    "params": {"message": "Ship it?", "requestedSchema": {"type": "object", "properties": {}}},
}


@pytest.fixture
def server(db):
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    return with_tools(server, "deploy")


@pytest.fixture
def olga(db):
    return make_user("olga", APPROVERS)


@pytest.fixture
def no_rules():
    """As if taskhub.approvals never registered its rules."""
    registered = list(permissions._answer_policies)
    permissions._answer_policies.clear()
    yield
    permissions._answer_policies[:] = registered


def test_without_approval_rules_a_launch_waits_at_a_gate_nobody_may_pass(server, olga, no_rules, caplog):
    task = services.launch(server=server, tool="deploy", arguments={}, user=None)

    task.refresh_from_db()
    assert task.status == TaskStatus.LAUNCHING and "did not register its approval rules" in task.status_message
    gate = InputRequest.objects.select_related("task__server").get(task=task, key=GATE_KEY)
    assert permissions.users_who_may_answer(server_id=server.pk, tool="deploy").count() == 0
    assert not permissions.may_answer(olga, gate)
    with pytest.raises(PolicyRefused, match=r"Nobody may answer: taskhub\.approvals did not register"):
        services.answer_input(input_request=gate, response={"action": "accept"}, user=olga)
    gate.refresh_from_db()
    assert gate.state == InputRequestState.OPEN and Task.objects.get(pk=task.pk).status == TaskStatus.LAUNCHING
    assert "did not register its approval rules" in caplog.text


def test_without_approval_rules_no_request_is_anyones_to_answer(server, olga, no_rules):
    # A request the server opened: it is nobody's to answer without the rules.
    task = Task.objects.create(server=server, tool="deploy", arguments={})
    snapshot = TaskSnapshot.model_validate(
        {"taskId": f"r-{task.id}", "status": "input_required", "inputRequests": {"q": FORM}, "ttlMs": None}
    )
    services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot))
    request = InputRequest.objects.select_related("task__server").get(task=task, key="q")

    assert not permissions.servers_user_may_approve(olga).exists()
    assert not InputRequest.objects.filter(permissions.requests_user_may_answer(olga)).exists()
    with pytest.raises(PolicyRefused, match=r"Nobody may answer: taskhub\.approvals did not register"):
        services.answer_input(input_request=request, response={"action": "accept", "content": {}}, user=olga)
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN and request.answer is None


def test_with_the_rules_registered_the_same_launch_runs(server, olga):
    """The control: the rules taskhub.approvals registers at start-up hold no gate where no policy asks for one."""
    task = services.launch(server=server, tool="deploy", arguments={}, user=None)
    assert not InputRequest.objects.filter(task=task).exists()
    assert Group.objects.filter(name=APPROVERS).exists()
