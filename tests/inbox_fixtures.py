"""Tasks that ask for input, made through the services as a server's answers would make them; the inbox tests'
servers (alpha approved by team-alpha, beta by team-beta) and ada, who approves for alpha. A plugin (conftest.py)."""

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from taskhub.accounts.groups import APPROVERS
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest
from tests.account_fixtures import make_user
from tests.approval_fixtures import add_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot


def remote_id(task) -> str:
    return f"r-{task.id}"


def task_asking(server, requests, tool="deploy"):
    """A task launched through services that the server then follows with an input_required snapshot."""
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments={}, user=None)
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=remote_id(task))))
    services.apply_snapshot(
        task=task, snapshot=snapshot("input_required", task_id=remote_id(task), inputRequests=requests)
    )
    return task


def request_of(task, key) -> InputRequest:
    return InputRequest.objects.select_related("task__server").get(task=task, key=key)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def servers():
    alpha = create_server(name="alpha", transport="http", url="http://alpha.example/mcp", user=None)
    beta = create_server(name="beta", transport="http", url="http://beta.example/mcp", user=None)
    add_approver_groups(alpha, Group.objects.create(name="team-alpha"))
    add_approver_groups(beta, Group.objects.create(name="team-beta"))
    return alpha, beta


@pytest.fixture
def ada(servers):
    return make_user("ada", APPROVERS, "team-alpha")
