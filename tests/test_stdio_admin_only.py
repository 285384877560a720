"""A stdio server's command runs on the worker's machine: only admins register one, and nothing else shapes it.

Not operators or approvers through the pages (add, or edit an HTTP server into a stdio one), not anybody
through the API (it has no way to register or change a server), not the arguments of a launched tool (through
the API, the pages' JSON or the `launch` command), and not what the server itself says when discovered.
"""

from __future__ import annotations

import sys

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.api.endpoints import api
from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.servers.discovery import discover_and_record
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks.models import Task
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.demo_process import PROJECT_ROOT
from tests.scripted_server import DISCOVER_RESULT, TOOLS_RESULT, ScriptedServer

pytestmark = pytest.mark.django_db

SMUGGLED = {
    "command": "/bin/sh",
    "args": ["-c", "touch /tmp/taskhub-pwned"],
    "env": {"LD_PRELOAD": "/x.so"},
    "cwd": "/",
}
STDIO_FORM = {
    "name": "sneaky",
    "transport": "stdio",
    "url": "",
    "command": "/bin/sh",
    "args": "-c\ntouch /tmp/taskhub-pwned",
    "env": "",
    "headers": "",
    "bearer_token": "",
    "enabled": "on",
}


def signed_in(*groups: str) -> Client:
    client = Client()
    client.force_login(make_user("someone", *groups))
    return client


def stdio_demo(user=None) -> Server:
    return create_server(
        name="local-demo",
        transport="stdio",
        command=sys.executable,
        args=["-m", "taskhub.demo", "--stdio"],
        env={"PYTHONPATH": str(PROJECT_ROOT)},
        user=user,
    )


def how_it_starts(server: Server) -> tuple:
    server.refresh_from_db()
    return server.transport, server.command, list(server.args), dict(server.env or {}), server.url, server.to_target()


@pytest.mark.parametrize("groups", [(), (OPERATORS,), (APPROVERS,), (OPERATORS, APPROVERS)])
def test_only_admins_register_a_stdio_server_through_the_pages(groups):
    response = signed_in(*groups).post(reverse("servers:add"), STDIO_FORM)
    assert response.status_code == 403
    assert not Server.objects.exists() and not AuditEvent.objects.exists()


@pytest.mark.parametrize("groups", [(OPERATORS,), (OPERATORS, APPROVERS)])
def test_a_non_admin_cannot_turn_an_http_server_into_a_stdio_one(groups):
    server = create_server(name="remote", transport="http", url="https://mcp.example/mcp", user=None)
    before = how_it_starts(server)
    response = signed_in(*groups).post(reverse("servers:edit", args=[server.pk]), {**STDIO_FORM, "name": "remote"})
    assert response.status_code == 403
    assert how_it_starts(server) == before


def test_an_admin_registers_exactly_the_command_given():
    response = signed_in(ADMINS).post(reverse("servers:add"), STDIO_FORM)
    assert response.status_code == 302
    server = Server.objects.get(name="sneaky")
    assert (server.command, server.args) == ("/bin/sh", ["-c", "touch /tmp/taskhub-pwned"])


def test_the_api_cannot_register_or_change_a_server():
    changing = {
        path: sorted(method for method in operations if method != "get")
        for path, operations in api.get_openapi_schema()["paths"].items()
        if "server" in path
    }
    assert not any(changing.values()), changing
    server = create_server(name="remote", transport="http", url="https://mcp.example/mcp", user=None)
    before = how_it_starts(server)
    _, secret = create_token(user=make_user("root", ADMINS, OPERATORS), name="ci")
    api_client = Client(headers={"Authorization": f"Bearer {secret}"})
    for method, path in [
        ("post", "/api/servers"),
        ("post", "/api/servers/"),
        ("put", f"/api/servers/{server.pk}"),
        ("patch", f"/api/servers/{server.pk}"),
        ("post", f"/api/servers/{server.pk}"),
    ]:
        response = getattr(api_client, method)(
            path, {**SMUGGLED, "transport": "stdio"}, content_type="application/json"
        )
        assert response.status_code in (404, 405), (method, path, response.status_code)
    assert Server.objects.count() == 1 and how_it_starts(server) == before


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_launching_with_arguments_that_name_a_command_runs_the_registered_one():
    server = stdio_demo()
    discover_and_record(server=server)
    before = how_it_starts(server)
    operator = make_user("olga", OPERATORS)
    _, secret = create_token(user=operator, name="ci")
    api_client = Client(headers={"Authorization": f"Bearer {secret}"})

    by_api = api_client.post(
        "/api/tasks",
        {"server": "local-demo", "tool": "quick", "arguments": {"text": "hi", **SMUGGLED}, **SMUGGLED},
        content_type="application/json",
    )
    assert by_api.status_code in (201, 400), by_api.content
    call_command("launch", "local-demo", "quick", "--as", "olga", "--arguments", '{"text": "hi", "command": "/bin/sh"}')
    for task in Task.objects.all():
        async_to_sync(jobs.launch)(task.id)
    assert how_it_starts(server) == before
    for task in Task.objects.all():
        task.refresh_from_db()
        assert task.status == "completed", (task.status, task.error)  # the demo ran, as registered


@pytest.mark.django_db(transaction=True)
def test_discovery_takes_no_command_from_what_the_server_says():
    says = {
        **DISCOVER_RESULT,
        **SMUGGLED,
        "transport": "stdio",
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "x", "version": "1", **SMUGGLED}},
    }
    tools = {**TOOLS_RESULT, "tools": [{"name": "work", "inputSchema": {"type": "object"}, **SMUGGLED}]}
    scripted = ScriptedServer({"server/discover": says, "tools/list": tools}).start()
    try:
        server = create_server(name="talkative", transport="http", url=scripted.url, user=None)
        before = how_it_starts(server)
        discover_and_record(server=server)
    finally:
        scripted.stop()
    server.refresh_from_db()
    assert server.discovered_at is not None, server.last_error
    assert how_it_starts(server) == before
