"""Removing a server (issue 15 item 8): confirmed, audited; its tasks and their history stay readable with its name;
nothing more is launched, polled or sent to it."""

import re
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.servers.discovery import adiscover_requested
from taskhub.servers.errors import ServerConfigInvalid, ServerRemoved
from taskhub.servers.models import Server
from taskhub.servers.services import create_server, remove_server, request_discovery, update_server
from taskhub.tasks import services
from taskhub.tasks.errors import InputNoLongerOpen, InvalidTransition
from taskhub.tasks.models import InputRequest, InputRequestState
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot
from tests.test_servers_pages import add_form

pytestmark = pytest.mark.django_db(transaction=True)
QUESTION = {"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": {"type": "object"}}}


@pytest.fixture
def world():
    alex = make_user("alex", ADMINS, APPROVERS)
    server = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/mcp", user=alex)
    with_tools(server, "deploy")
    task = services.launch(server=server, tool="deploy", arguments={}, user=alex)
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot("working")))
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", inputRequests={"go": QUESTION}))
    client = Client()
    client.force_login(alex)
    return alex, server, task, client


def test_removal_asks_for_the_name_then_removes_and_audits(world):
    alex, server, task, client = world
    page = client.get(reverse("servers:remove", args=[server.pk])).content.decode()
    assert "Remove alpha?" in page and "1 live task" in page and "1 task" in page
    response = client.post(reverse("servers:remove", args=[server.pk]), {"confirm": "alph"})
    assert response.status_code == 400 and "Nothing was removed" in response.content.decode()
    server.refresh_from_db()
    assert server.removed_at is None and server.enabled

    response = client.post(reverse("servers:remove", args=[server.pk]), {"confirm": "alpha"}, follow=True)
    assert "Server alpha removed." in response.content.decode()
    server.refresh_from_db()
    assert server.removed_at is not None and server.removed_by == alex and not server.enabled
    event = AuditEvent.objects.get(action="server.removed")
    assert (event.actor, event.server_id, event.data) == (alex, server.pk, {"name": "alpha"})
    # Out of the list (under "removed"), its task and its history readable with its name.
    listing = client.get(reverse("servers:list")).content.decode()
    assert "1 removed server" in listing and 'href="/servers/add/"' in listing
    detail = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert "Server removed" in detail and "alpha" in detail
    assert "was removed before this was answered" in detail  # its open request: nothing to answer
    assert "alpha" in client.get(reverse("audit:list")).content.decode()
    # Removing again, editing, discovering: refused, and nothing more recorded.
    remove_server(server=server, user=alex)
    assert AuditEvent.objects.filter(action="server.removed").count() == 1
    assert client.get(reverse("servers:edit", args=[server.pk])).status_code == 302
    with pytest.raises(ServerRemoved):
        update_server(server=server, user=alex, enabled=True)
    with pytest.raises(ServerRemoved):
        request_discovery(server=server, user=alex)
    with pytest.raises(CommandError, match="was removed"):
        call_command("server", "update", "alpha", "--enabled", "true")
    assert not Server.objects.get(pk=server.pk).enabled
    # Its open request takes no answer, on the page or through the API.
    request = InputRequest.objects.get(task=task, key="go")
    response = client.post(reverse("tasks:answer", args=[request.pk]), {"action": "decline"})
    assert response.status_code == 400 and "was removed" in response.content.decode()
    with pytest.raises(InputNoLongerOpen, match="was removed"):
        services.answer_input(input_request=request, response={"action": "decline"}, user=alex)
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN


def test_nothing_is_launched_or_sent_to_a_removed_server(world):
    alex, server, task, _ = world
    operator = make_user("olga", OPERATORS)
    request = InputRequest.objects.get(task=task, key="go")
    services.answer_input(input_request=request, response={"action": "accept", "content": {}}, user=alex)
    services.request_cancel(task=task, user=operator)
    remove_server(server=server, user=alex)
    server.refresh_from_db()
    with pytest.raises(InvalidTransition, match="was removed"):
        services.launch(server=server, tool="deploy", arguments={}, user=operator)
    # The answer and the cancel queued before the removal are not sent (the URL answers nothing anyway).
    assert async_to_sync(jobs.deliver)(request.pk) == "server removed"
    assert async_to_sync(jobs.cancel)(task.id) == "server removed"
    assert async_to_sync(adiscover_requested)(server_id=server.pk, requested_by=None) == "server removed meanwhile"
    request.refresh_from_db()
    assert request.state == InputRequestState.ANSWERED
    actions = list(AuditEvent.objects.filter(task_id=task.pk).order_by("id").values_list("action", flat=True))
    assert actions[-2:] == ["input.delivery_failed", "task.cancel_failed"]


def _server_options(html: str) -> list[str]:
    select = re.search(r'<select name="server"[^>]*>(.*?)</select>', html, re.S)
    assert select, "no server filter on the page"
    return [re.sub(r"\s+", " ", label).strip() for label in re.findall(r"<option[^>]*>(.*?)</option>", select[1], re.S)]


def test_a_removed_server_leaves_the_filters_and_the_list_and_frees_its_name(world):
    alex, server, task, client = world
    create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=alex)
    assert "alpha" in _server_options(client.get(reverse("tasks:inbox")).content.decode())
    assert "alpha" in _server_options(client.get(reverse("tasks:list")).content.decode())
    remove_server(server=server, user=alex)

    # Not offered in the inbox's or the task list's filter any more ...
    assert _server_options(client.get(reverse("tasks:inbox")).content.decode()) == ["any server", "beta"]
    assert _server_options(client.get(reverse("tasks:list")).content.decode()) == ["any server"]  # beta: no tasks
    # ... but its page's link to its tasks still works, the choice named as removed.
    with CaptureQueriesContext(connection) as queries:
        listing = client.get(reverse("tasks:list"), {"server": server.pk}).content.decode()
    # The choices come from one SELECT, not a server-side cursor's DECLARE, FETCH and CLOSE (ServersInOneRead).
    assert not [query for query in queries.captured_queries if "DECLARE" in query["sql"]]
    assert _server_options(listing) == ["any server", "alpha (removed)"]
    assert f'href="{reverse("tasks:detail", args=[task.pk])}"' in listing

    # `server list` hides it; with --all it is there, marked removed.
    out = StringIO()
    call_command("server", "list", stdout=out)
    assert [line.split("\t")[0] for line in out.getvalue().splitlines()] == ["beta"]
    out = StringIO()
    call_command("server", "list", "--all", stdout=out)
    assert [line.split("\t")[:3:2] for line in out.getvalue().splitlines()] == [
        ["alpha", "removed"],
        ["beta", "enabled"],
    ]

    # Its name is free: a new server takes it (on the page too); the old tasks keep the old server.
    response = client.post(reverse("servers:add"), add_form(name="alpha", url="http://127.0.0.1:9/new"))
    assert response.status_code == 302, response.content.decode()
    new = Server.objects.get(name="alpha", removed_at__isnull=True)
    assert new.pk != server.pk and Server.objects.filter(name="alpha").count() == 2
    task.refresh_from_db()
    assert task.server_id == server.pk
    # The name is taken by the new one, which the commands now mean by it.
    with pytest.raises(ServerConfigInvalid, match="already exists"):
        create_server(name="alpha", transport="http", url="http://127.0.0.1:9/third", user=alex)
    response = client.post(reverse("servers:add"), add_form(name="alpha"))
    assert response.status_code == 400
    assert re.search(r'id="id_name".*?Server with this Name already exists', response.content.decode(), re.S)
    call_command("server", "update", "alpha", "--enabled", "false")
    new.refresh_from_db()
    assert not new.enabled and Server.objects.get(pk=server.pk).removed_at is not None
    # The audit trail's filter keeps the removed one (its history), told apart from the new one.
    assert _server_options(client.get(reverse("audit:list")).content.decode()) == [
        "any server",
        "alpha",
        "alpha (removed)",
        "beta",
    ]
