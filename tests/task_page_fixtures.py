"""Servers, people and durable tasks for the task pages and bulk cancel: alpha (approved by alpha-approvers), beta
(by beta-approvers), olga the operator, amy who approves for alpha only. A plugin (conftest.py)."""

import pytest
from django.contrib.auth.models import Group

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import Task
from tests.account_fixtures import make_user
from tests.approval_fixtures import set_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot

_remote_ids = iter(range(1, 10_000))


def durable(server, user, tool="deploy", status="working", **fields) -> Task:
    """A task launched and made durable through the services, then moved to `status` by a snapshot."""
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments={"target": "prod"}, user=user)
    remote = f"remote-{next(_remote_ids)}"
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=remote)))
    if status != "working" or fields:
        services.apply_snapshot(task=task, snapshot=snapshot(status, task_id=remote, **fields))
        task.refresh_from_db()
    return task


def signed_in(client, user):
    client.force_login(user)
    return client


@pytest.fixture
def alpha():
    server = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    set_approver_groups(server, [Group.objects.get_or_create(name="alpha-approvers")[0]])
    return server


@pytest.fixture
def beta():
    server = create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=None)
    set_approver_groups(server, [Group.objects.get_or_create(name="beta-approvers")[0]])
    return server


@pytest.fixture
def olga():
    return make_user("olga", OPERATORS)


@pytest.fixture
def amy():
    """Approves for alpha only."""
    return make_user("amy", APPROVERS, "alpha-approvers")
