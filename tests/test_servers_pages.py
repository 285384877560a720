"""Servers pages (admins) and Launch pages (operators): permissions, write-only credentials, discovery, launch."""

import re
import time
import uuid

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group
from django.db import transaction
from django.urls import reverse
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.servers.hooks import DISCOVERY_JOB
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks.models import Task
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.approval_fixtures import add_approver_groups
from tests.demo_process import DemoServer
from tests.helpers import free_port

pytestmark = pytest.mark.django_db

TOKEN = "tok-7f3a-very-secret"
HEADER_VALUE = "hdr-91c2-very-secret"
ENV_VALUE = "env-55d0-very-secret"


@pytest.fixture
def admin(client):
    user = make_user("alex", ADMINS)
    client.force_login(user)
    return user


@pytest.fixture
def operator(client):
    user = make_user("olga", OPERATORS)
    client.force_login(user)
    return user


def add_form(**overrides):
    data = {
        "name": "demo",
        "transport": "http",
        "url": "http://127.0.0.1:8765/mcp",
        "command": "",
        "args": "",
        "enabled": "on",
        "bearer_token": "",
        "headers": "",
        "env": "",
    }
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not None}


def edit_form(server, **overrides):
    data = {
        "name": server.name,
        "transport": server.transport,
        "url": server.url,
        "command": server.command,
        "args": "\n".join(server.args),
        "enabled": "on" if server.enabled else None,
    }
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not None}


def make_server(**fields):
    defaults = {"name": "demo", "transport": "http", "url": "http://127.0.0.1:1/mcp", "user": None}
    defaults.update(fields)
    return create_server(**defaults)


def page(response) -> str:
    return response.content.decode()


# --- permissions -------------------------------------------------------------------------------------


SERVER_URLS = [
    ("get", "servers:list", {}),
    ("get", "servers:add", {}),
    ("get", "servers:detail", {"server_id": "ID"}),
    ("get", "servers:edit", {"server_id": "ID"}),
    ("post", "servers:discover", {"server_id": "ID"}),
    ("get", "servers:discovery", {"server_id": "ID"}),
]


def resolve(name, kwargs, server):
    return reverse(name, kwargs={k: (server.pk if v == "ID" else v) for k, v in kwargs.items()})


@pytest.mark.parametrize(("method", "name", "kwargs"), SERVER_URLS)
def test_server_pages_send_strangers_to_sign_in(client, method, name, kwargs):
    server = make_server()
    response = getattr(client, method)(resolve(name, kwargs, server))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize(("method", "name", "kwargs"), SERVER_URLS)
def test_server_pages_refuse_operators_and_approvers(client, method, name, kwargs):
    server = make_server()
    client.force_login(make_user("olga", OPERATORS, APPROVERS))
    response = getattr(client, method)(resolve(name, kwargs, server))
    assert response.status_code == 403
    assert "This page is for admins." in page(response)
    assert not AuditEvent.objects.exclude(action="server.created").exists()


def test_discover_is_post_only(client, admin):
    server = make_server()
    assert client.get(reverse("servers:discover", args=[server.pk])).status_code == 405


# --- list -------------------------------------------------------------------------------------------------


def test_empty_server_list_tells_the_admin_to_add_one(client, admin):
    html = page(client.get(reverse("servers:list")))
    assert "No servers yet" in html
    assert reverse("servers:add") in html


def test_server_list_shows_health_endpoint_tools_and_groups(client, admin):
    from django.utils import timezone

    never = make_server(name="never")
    ok = make_server(name="ok", transport="stdio", url="", command="python", args=["-m", "x"])
    Server.objects.filter(pk=ok.pk).update(
        last_success_at=timezone.now(), discovered_at=timezone.now(), tools=[{"name": "a"}, {"name": "b"}, "junk"]
    )
    down = make_server(name="down", url="http://user:pw123@127.0.0.1:1/mcp", enabled=False)
    Server.objects.filter(pk=down.pk).update(unreachable_since=timezone.now(), last_error="refused")
    add_approver_groups(ok, Group.objects.get(name=APPROVERS))

    html = page(client.get(reverse("servers:list")))
    rows = {name: re.search(rf">{name}</a>.*?</tr>", html, re.S).group(0) for name in ("never", "ok", "down")}
    assert "never contacted" in rows["never"]
    assert "health-reachable" in rows["ok"] and "python -m x" in rows["ok"] and ">2<" in rows["ok"]
    assert APPROVERS in rows["ok"]
    assert "unreachable since" in rows["down"] and "disabled" in rows["down"]
    assert "pw123" not in html  # a password inside the URL is not shown
    assert "every approver" in rows["never"]
    assert str(never.pk) in html


# --- add / edit -------------------------------------------------------------------------------------------


def test_admin_adds_an_http_server_with_credentials_that_are_never_shown_back(client, admin):
    response = client.post(
        reverse("servers:add"), add_form(bearer_token=TOKEN, headers=f"X-Api-Key: {HEADER_VALUE}\n\n")
    )
    server = Server.objects.get(name="demo")
    assert response.status_code == 302
    assert response["Location"] == reverse("servers:detail", args=[server.pk])
    assert server.bearer_token == TOKEN
    assert server.headers == {"X-Api-Key": HEADER_VALUE}

    event = AuditEvent.objects.get(server=server, action="server.created")
    assert event.actor_label == "alex"
    for secret in (TOKEN, HEADER_VALUE):
        assert secret not in str(event.data)

    detail = page(client.get(response["Location"]))
    assert "Server demo added" in detail
    assert "X-Api-Key" in detail
    for secret in (TOKEN, HEADER_VALUE):
        assert secret not in detail
    assert detail.count(">set<") == 2  # token and one header

    edit = page(client.get(reverse("servers:edit", args=[server.pk])))
    for secret in (TOKEN, HEADER_VALUE):
        assert secret not in edit
    assert "A token is stored" in edit
    assert 'name="remove_headers" value="X-Api-Key"' in edit


def test_admin_adds_a_stdio_server_with_arguments_one_per_line_and_environment(client, admin):
    response = client.post(
        reverse("servers:add"),
        add_form(
            transport="stdio", url="", command="python3", args="-m\ntaskhub.demo\n\n--stdio ", env=f"TOKEN={ENV_VALUE}"
        ),
    )
    assert response.status_code == 302
    server = Server.objects.get(name="demo")
    assert (server.command, server.args, server.env) == (
        "python3",
        ["-m", "taskhub.demo", "--stdio"],
        {"TOKEN": ENV_VALUE},
    )
    detail = page(client.get(response["Location"]))
    assert "python3 -m taskhub.demo --stdio" in detail
    assert "TOKEN" in detail and ENV_VALUE not in detail


@pytest.mark.parametrize(
    ("overrides", "field_text"),
    [
        ({"url": ""}, "A Streamable HTTP server needs its URL."),
        ({"transport": "stdio", "url": "", "command": ""}, "A stdio server needs the command that starts it."),
        ({"url": "not a url"}, "Enter a valid URL."),
        ({"name": ""}, "This field is required."),
        ({"headers": f"X-Api-Key {HEADER_VALUE}"}, "Line 1 is not of the form"),
        ({"headers": f"Authorization: Bearer {HEADER_VALUE}"}, "set by the bearer token field"),
        ({"headers": f"Bad Name: {HEADER_VALUE}"}, "Line 1: a header name has only"),
        ({"env": f"\n1BAD={ENV_VALUE}"}, "Line 2: a variable name"),
        ({"env": ENV_VALUE}, "Line 1 is not of the form"),
    ],
)
def test_bad_settings_are_refused_inline_without_echoing_secrets(client, admin, overrides, field_text):
    data = add_form(bearer_token=TOKEN, **overrides)
    response = client.post(reverse("servers:add"), data)
    html = page(response)
    assert response.status_code == 400
    assert field_text in html
    assert "The server was not saved" in html
    assert "type them once more" in html
    for secret in (TOKEN, HEADER_VALUE, ENV_VALUE):
        assert secret not in html
    assert not Server.objects.exists()
    assert not AuditEvent.objects.exists()


def test_a_taken_name_comes_back_from_the_service_next_to_the_name(client, admin):
    make_server(name="demo")
    response = client.post(reverse("servers:add"), add_form())
    assert response.status_code == 400
    assert re.search(r'id="id_name".*?Server with this Name already exists', page(response), re.S)
    assert Server.objects.count() == 1


def test_editing_keeps_replaces_and_removes_credentials_and_audits_no_values(client, admin):
    server = make_server(bearer_token=TOKEN, headers={"X-Api-Key": "old-value", "X-Keep": "kept-value"})
    url = reverse("servers:edit", args=[server.pk])

    # Blank token keeps it; a header named again gets the new value.
    response = client.post(url, edit_form(server, headers=f"X-Api-Key: {HEADER_VALUE}"))
    assert response.status_code == 302
    server.refresh_from_db()
    assert server.bearer_token == TOKEN
    assert server.headers == {"X-Api-Key": HEADER_VALUE, "X-Keep": "kept-value"}
    event = AuditEvent.objects.filter(server=server, action="server.updated").latest("id")
    assert event.data["changed"] == {"headers": "(secret changed)"}

    # Remove one header and the token; rename.
    response = client.post(url, edit_form(server, name="demo2", remove_headers=["X-Api-Key"], remove_bearer_token="on"))
    assert response.status_code == 302
    server.refresh_from_db()
    assert server.name == "demo2"
    assert server.bearer_token is None
    assert server.headers == {"X-Keep": "kept-value"}
    event = AuditEvent.objects.filter(server=server, action="server.updated").latest("id")
    assert event.data["changed"] == {
        "name": "demo2",
        "headers": "(secret changed)",
        "bearer_token": "(secret changed)",
    }
    for event in AuditEvent.objects.all():
        for secret in (TOKEN, HEADER_VALUE, "old-value", "kept-value"):
            assert secret not in str(event.data)

    # Nothing changed: no audit row.
    before = AuditEvent.objects.count()
    assert client.post(url, edit_form(server)).status_code == 302
    assert AuditEvent.objects.count() == before


def test_edit_refuses_a_new_token_together_with_remove(client, admin):
    server = make_server(bearer_token="first")
    response = client.post(
        reverse("servers:edit", args=[server.pk]), edit_form(server, bearer_token=TOKEN, remove_bearer_token="on")
    )
    assert response.status_code == 400
    assert "Either type a new token or remove the stored one" in page(response)
    assert TOKEN not in page(response)
    server.refresh_from_db()
    assert server.bearer_token == "first"


def test_stdio_environment_can_be_replaced_and_removed(client, admin):
    server = make_server(transport="stdio", url="", command="prog", env={"A": "1", "B": "2"})
    url = reverse("servers:edit", args=[server.pk])
    assert client.post(url, edit_form(server, env="A=changed\nC=3", remove_env=["B"])).status_code == 302
    server.refresh_from_db()
    assert server.env == {"A": "changed", "C": "3"}
    edit = page(client.get(url))
    assert "changed" not in edit.replace("gets the new value", "")  # names only
    assert 'name="remove_env" value="A"' in edit and 'name="remove_env" value="C"' in edit


def test_an_admin_sets_and_clears_a_servers_worker_limits(client, admin):
    server = make_server()
    url = reverse("servers:edit", args=[server.pk])
    limits = {"max_concurrent_jobs": "2", "call_timeout_seconds": "15", "question_wait_seconds": "300"}
    assert client.post(url, edit_form(server, **limits)).status_code == 302
    server.refresh_from_db()
    assert (server.max_concurrent_jobs, server.call_timeout_seconds, server.question_wait_seconds) == (2, 15, 300)
    edit = page(client.get(url))
    assert 'name="call_timeout_seconds" value="15"' in edit and 'name="question_wait_seconds" value="300"' in edit
    out_of_range = {"max_concurrent_jobs": "0", "call_timeout_seconds": "7200", "question_wait_seconds": "5"}
    refused = client.post(url, edit_form(server, **out_of_range))
    assert refused.status_code == 400 and page(refused).count('class="field-error"') == 3
    assert client.post(url, edit_form(server)).status_code == 302  # left empty: the worker's defaults again
    server.refresh_from_db()
    assert (server.max_concurrent_jobs, server.call_timeout_seconds, server.question_wait_seconds) == (None, None, None)


# --- detail -----------------------------------------------------------------------------------------------


HOSTILE_TOOLS = [
    {
        "name": "evil",
        "title": "<img src=x onerror=alert(1)>",
        "description": "<script>alert(2)</script>",
        "annotations": {"readOnlyHint": True, "destructiveHint": False},
        "execution": {"taskSupport": "required"},
        "inputSchema": {"type": "object", "properties": {"a": {"title": "<b>x</b>", "type": "string"}}},
    },
    {"name": "plain", "annotations": "not a dict", "inputSchema": "nope"},
    {"title": "nameless"},
    42,
]


def test_detail_shows_capabilities_tools_health_and_credentials_as_set_or_not(client, admin):
    from django.utils import timezone

    server = make_server(bearer_token=TOKEN)
    Server.objects.filter(pk=server.pk).update(
        capabilities={"tools": {"listChanged": True}, "extensions": {"io.modelcontextprotocol/tasks": {}}},
        tools=HOSTILE_TOOLS,
        discovered_at=timezone.now(),
        last_error="connection refused <b>",
        last_error_at=timezone.now(),
        unreachable_since=timezone.now(),
    )
    html = page(client.get(reverse("servers:detail", args=[server.pk])))
    assert "&quot;listChanged&quot;: true" in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html and "<script>alert(2)" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "read-only" in html and "not destructive" in html and "always runs as a task" in html
    assert ">plain<" in html and "nameless" not in html
    assert "connection refused &lt;b&gt;" in html
    assert "unreachable since" in html
    assert TOKEN not in html
    assert "Discover now" in html and reverse("servers:edit", args=[server.pk]) in html
    assert "no approval policy: every approver may answer" in html


def test_unknown_server_is_404(client, admin):
    assert client.get(reverse("servers:detail", args=[999999])).status_code == 404
    assert client.post(reverse("servers:discover", args=[999999])).status_code == 404


# --- discover ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    """One demo server for the discovery tests. It asks for TOKEN, so that one server serves both the test that
    sends it and the one that sends a wrong one."""
    with DemoServer("--require-token", TOKEN) as server:
        yield server


def queued_discoveries(server) -> list[ProcrastinateJob]:
    return list(ProcrastinateJob.objects.filter(task_name=DISCOVERY_JOB, args__server_id=server.pk, status="todo"))


def run_discovery_job(server) -> str:
    """What a worker does with the discovery job the page deferred (here, in the test's transaction)."""
    (job,) = queued_discoveries(server)
    return async_to_sync(jobs.discover_server.func)(**job.args)


def discovery_part(client, server) -> str:
    """What the page's poll gets: the discovery part of the server's page."""
    response = client.get(reverse("servers:discovery", args=[server.pk]))
    assert response.status_code == 200
    html = page(response).strip()
    # One element, swapped for the one the page shows (outerHTML): nothing around it would pile up on the page.
    assert html.startswith('<div id="server-discovery"') and html.endswith("</div>")
    return html


POLLING = 'hx-trigger="every 1s"'
LIST_DELAY_SECONDS = 3


@pytest.mark.slow
def test_adding_a_server_returns_its_page_at_once_and_the_job_records_its_tools(client, admin):
    with DemoServer("--list-delay-ms", str(LIST_DELAY_SECONDS * 1000)) as slow:
        started = time.monotonic()
        response = client.post(reverse("servers:add"), add_form(url=slow.url))
        answered_after = time.monotonic() - started
        server = Server.objects.get(name="demo")
        # The page came back before the slow server could have answered tools/list: discovery is still to come.
        assert response.status_code == 302 and answered_after < LIST_DELAY_SECONDS
        assert server.is_discovering and server.discovered_at is None
        (job,) = queued_discoveries(server)
        assert job.lock == job.queueing_lock == f"discover:{server.pk}"
        detail = page(client.get(response["Location"]))
        assert "Server demo added" in detail and "Discovering…" in detail and POLLING in detail

        started = time.monotonic()
        assert run_discovery_job(server) == "discovered 9 tools"
        assert time.monotonic() - started >= LIST_DELAY_SECONDS  # the server was that slow to answer discovery
    server.refresh_from_db()
    assert {tool["name"] for tool in server.tools} >= {"approval", "quick", "long"}
    assert not server.is_discovering and server.discovery_error == ""
    assert AuditEvent.objects.get(server=server, action="server.discovered").actor_label == "alex"
    html = discovery_part(client, server)
    assert "Discovered demo: 9 tools." in html and "Ask a human to approve" in html
    assert POLLING not in html  # the page stops asking


def test_the_discovery_job_commits_with_the_server_or_not_at_all(admin):
    with pytest.raises(RuntimeError, match="rolled back"), transaction.atomic():
        server = make_server(user=admin, discover_in_background=True)
        assert len(queued_discoveries(server)) == 1
        raise RuntimeError("rolled back")
    assert not ProcrastinateJob.objects.filter(task_name=DISCOVERY_JOB).exists()


def test_a_server_added_from_a_script_is_not_discovered_in_the_background(client, admin):
    server = make_server()
    assert not server.is_discovering and queued_discoveries(server) == []


def test_discover_now_defers_one_job_however_often_it_is_pressed(client, admin):
    server = make_server()
    first = client.post(reverse("servers:discover", args=[server.pk]))
    again = client.post(reverse("servers:discover", args=[server.pk]))
    assert first.status_code == again.status_code == 302
    assert len(queued_discoveries(server)) == 1
    server.refresh_from_db()
    assert server.is_discovering
    html = page(client.get(reverse("servers:detail", args=[server.pk])))
    assert "Discovering…" in html and POLLING in html
    assert POLLING in discovery_part(client, server)  # still running: the page keeps asking


@pytest.mark.slow
def test_discover_now_reads_the_demo_servers_tools(client, admin, demo):
    server = make_server(url=demo.url, bearer_token=TOKEN)
    client.post(reverse("servers:discover", args=[server.pk]))
    run_discovery_job(server)
    html = discovery_part(client, server)
    server.refresh_from_db()
    assert "Discovered demo: 9 tools" in html
    assert {tool["name"] for tool in server.tools} >= {"approval", "quick", "long"}
    assert "io.modelcontextprotocol/tasks" in server.capabilities.get("extensions", {})
    assert server.last_success_at is not None and server.unreachable_since is None
    assert "approval" in html and "Ask a human to approve" in html
    event = AuditEvent.objects.get(server=server, action="server.discovered")
    assert event.actor_label == "alex"


@pytest.mark.slow
def test_discover_with_a_bearer_token_the_server_requires(client, admin, demo):
    wrong = make_server(name="wrong", url=demo.url, bearer_token="not-it")
    right = make_server(name="right", url=demo.url, bearer_token=TOKEN)
    for server in (wrong, right):
        client.post(reverse("servers:discover", args=[server.pk]))
        run_discovery_job(server)
    refused, accepted = discovery_part(client, wrong), discovery_part(client, right)
    assert "Discovery of wrong failed" in refused and "401" in refused
    assert "Discovered right" in accepted
    assert TOKEN not in refused + accepted


def test_discover_where_nothing_listens_says_so_and_marks_the_server(client, admin):
    server = make_server(url=f"http://127.0.0.1:{free_port()}/mcp")
    client.post(reverse("servers:discover", args=[server.pk]))
    assert run_discovery_job(server).startswith("discovery failed")
    html = discovery_part(client, server)
    server.refresh_from_db()
    assert 'role="alert">Discovery of demo failed' in html and POLLING not in html
    assert server.discovery_error and not server.is_discovering
    assert server.unreachable_since is not None and server.last_error
    assert "unreachable since" in html
    assert server.discovered_at is None
    assert AuditEvent.objects.filter(server=server, action="server.unreachable").exists()
    # The failure stays on the page until a discovery succeeds.
    assert "Discovery of demo failed" in page(client.get(reverse("servers:detail", args=[server.pk])))


def test_discover_gives_up_after_its_timeout(client, admin, monkeypatch):
    import socket

    from taskhub.servers import discovery

    monkeypatch.setattr(discovery.adiscover_and_record, "__kwdefaults__", {"user": None, "timeout": 1.0})
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        server = make_server(url=f"http://127.0.0.1:{silent.getsockname()[1]}/mcp")
        client.post(reverse("servers:discover", args=[server.pk]))
        run_discovery_job(server)
    assert "Discovery of demo failed: No answer within 1 s." in discovery_part(client, server)
    server.refresh_from_db()
    assert server.unreachable_since is not None


def test_the_job_of_a_server_deleted_meanwhile_does_nothing(client, admin):
    server = make_server()
    client.post(reverse("servers:discover", args=[server.pk]))
    Server.objects.filter(pk=server.pk).delete()
    assert run_discovery_job(server) == "server deleted meanwhile"


# --- launch -----------------------------------------------------------------------------------------------

APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {"action": {"default": "deploy", "maxLength": 200, "title": "Action", "type": "string"}},
    "title": "approvalArguments",
}
RICH_SCHEMA = {
    "type": "object",
    "properties": {
        "email": {"type": "string", "format": "email", "title": "Email", "description": "<i>who</i>"},
        "count": {"type": "integer", "minimum": 1, "maximum": 10, "default": 2},
        "color": {"oneOf": [{"const": "r", "title": "Red"}, {"const": "g", "title": "Green"}]},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
        "dry_run": {"type": "boolean", "default": True},
    },
    "required": ["email"],
}
NESTED_SCHEMA = {
    "type": "object",
    "properties": {"target": {"type": "object", "properties": {"host": {"type": "string"}}, "default": {"host": "h"}}},
    "required": ["target"],
}


def discovered_server(name="demo", enabled=True, tools=None):
    from django.utils import timezone

    server = make_server(name=name, enabled=enabled)
    Server.objects.filter(pk=server.pk).update(
        discovered_at=timezone.now(),
        tools=tools
        if tools is not None
        else [
            {
                "name": "approval",
                "description": "Ask a human to approve.",
                "inputSchema": APPROVAL_SCHEMA,
                "annotations": {"destructiveHint": True},
            },
            {"name": "rich", "title": "Rich tool", "inputSchema": RICH_SCHEMA},
            {"name": "nested", "inputSchema": NESTED_SCHEMA},
            {"name": "odd/name tool", "inputSchema": {"type": "object"}},
        ],
    )
    server.refresh_from_db()
    return server


def launch_url(server, tool):
    return reverse("tasks:launch_tool", args=[server.pk, tool])


@pytest.mark.parametrize("name", ["tasks:launch", "tasks:launch_tool"])
def test_launch_pages_send_strangers_to_sign_in_and_refuse_approvers(client, name):
    server = discovered_server()
    url = reverse(name) if name == "tasks:launch" else launch_url(server, "approval")
    assert client.get(url)["Location"].startswith("/accounts/login/")
    client.force_login(make_user("ada", APPROVERS))
    assert client.get(url).status_code == 403
    assert client.post(url, {"arg.action": "x"}).status_code == 403
    assert not Task.objects.exists()


def test_chooser_lists_enabled_servers_tools_and_says_when_one_was_never_discovered(client, operator):
    discovered_server()
    discovered_server(name="off", enabled=False)
    make_server(name="fresh")
    html = page(client.get(reverse("tasks:launch")))
    assert "Rich tool" in html and "destructive" in html and "Ask a human to approve." in html
    assert ">off<" not in html
    assert "has not been discovered yet" in html and "Ask an admin to discover it" in html
    assert launch_url(Server.objects.get(name="demo"), "odd/name tool") in html


def test_chooser_links_admins_to_discovery_and_says_when_nothing_is_enabled(client, admin):
    fresh = make_server(name="fresh")
    html = page(client.get(reverse("tasks:launch")))
    assert reverse("servers:detail", args=[fresh.pk]) in html and "Discover now" in html
    Server.objects.update(enabled=False)
    html = page(client.get(reverse("tasks:launch")))
    assert "No enabled servers" in html and reverse("servers:add") in html


def test_only_catalogued_tools_on_enabled_servers_can_be_launched(client, operator):
    server = discovered_server()
    assert client.get(launch_url(server, "not-there")).status_code == 404
    assert client.post(launch_url(server, "not-there"), {}).status_code == 404
    off = discovered_server(name="off", enabled=False)
    response = client.get(launch_url(off, "approval"))
    assert response.status_code == 403 and "disabled" in page(response)
    assert client.post(launch_url(off, "approval"), {"arg.action": "x"}).status_code == 403
    assert client.get(reverse("tasks:launch_tool", args=[999999, "approval"])).status_code == 404
    assert not Task.objects.exists()


def test_the_form_is_generated_from_the_schema_with_defaults(client, operator):
    server = discovered_server()
    html = page(client.get(launch_url(server, "rich")))
    assert re.search(r'<input type="email" id="arg-0" name="arg.email" value=""[^>]*required', html)
    assert re.search(r'type="number" id="arg-\d" name="arg.count" value="2"[^>]*min="1"[^>]*max="10"', html)
    assert ">Red</option>" in html and ">Green</option>" in html
    assert html.count('name="arg.tags"') == 3
    assert re.search(r'type="checkbox" id="arg-\d" name="arg.dry_run" checked', html)
    assert "&lt;i&gt;who&lt;/i&gt;" in html
    assert "Edit as JSON" in html


def test_launching_through_the_form_creates_the_task_and_opens_its_page(client, operator):
    server = discovered_server()
    response = client.post(
        launch_url(server, "rich"),
        {"mode": "form", "arg.email": "a@b.example", "arg.count": "3", "arg.color": "1", "arg.tags": ["0", "2"]},
    )
    task = Task.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/tasks/{task.id}/"
    assert task.arguments == {"email": "a@b.example", "count": 3, "color": "g", "tags": ["a", "c"], "dry_run": False}
    assert (task.server, task.tool, task.launched_by) == (server, "rich", operator)


def test_bad_arguments_are_shown_next_to_their_fields_and_nothing_is_launched(client, operator):
    server = discovered_server()
    response = client.post(launch_url(server, "rich"), {"mode": "form", "arg.email": "nope", "arg.count": "11"})
    html = page(response)
    assert response.status_code == 400
    assert re.search(r'name="arg.email" value="nope".*?must be an email address', html, re.S)
    assert re.search(r'name="arg.count" value="11".*?must be at most 10', html, re.S)
    assert "Some arguments need a fix" in html

    response = client.post(launch_url(server, "rich"), {"mode": "form", "arg.email": "", "arg.count": "two"})
    html = page(response)
    assert "this field is required" in html and "must be a whole number" in html
    assert not Task.objects.exists()


def test_json_mode_launches_validates_and_explains(client, operator):
    server = discovered_server()
    url = launch_url(server, "approval")
    html = page(client.get(url + "?mode=json"))
    assert '<textarea id="arguments-json"' in html and "&quot;action&quot;: &quot;deploy&quot;" in html

    for text, message in [
        ("{not json", "This is not valid JSON"),
        ("[1, 2]", "The arguments must be a JSON object"),
        ('{"action": 5}', "action: must be text"),
        ('{"action": "' + "x" * 201 + '"}', "action: must be at most 200 characters long"),
    ]:
        response = client.post(url, {"mode": "json", "arguments_json": text})
        assert response.status_code == 400
        assert message in page(response)
    assert not Task.objects.exists()

    response = client.post(url, {"mode": "json", "arguments_json": '{"action": "ship it"}'})
    task = Task.objects.get()
    assert response["Location"] == reverse("tasks:detail", args=[task.id])
    assert task.arguments == {"action": "ship it"}


def test_switching_between_form_and_json_carries_the_values(client, operator):
    server = discovered_server()
    url = launch_url(server, "rich")
    response = client.post(url, {"mode": "form", "arg.email": "x@y.example", "arg.count": "4", "switch": "json"})
    html = page(response)
    assert response.status_code == 200
    assert "&quot;email&quot;: &quot;x@y.example&quot;" in html and "&quot;count&quot;: 4" in html
    assert "Back to the form" in html

    response = client.post(
        url, {"mode": "json", "arguments_json": '{"email": "z@y.example", "count": 7, "tags": ["b"]}', "switch": "form"}
    )
    html = page(response)
    assert 'value="z@y.example"' in html and 'value="7"' in html
    assert re.search(r'name="arg.tags" value="1" checked', html)
    assert not Task.objects.exists()


def test_a_schema_the_form_cannot_show_falls_back_to_json_with_its_defaults(client, operator):
    server = discovered_server()
    url = launch_url(server, "nested")
    html = page(client.get(url))
    assert "cannot show" in html and '<textarea id="arguments-json"' in html
    assert "&quot;host&quot;: &quot;h&quot;" in html and "Back to the form" not in html
    response = client.post(url, {"mode": "form", "arguments_json": '{"target": {"host": 5}}'})
    assert response.status_code == 400 and "target: host: must be text" in page(response)
    response = client.post(url, {"arguments_json": '{"target": {"host": "db1"}}'})
    assert response.status_code == 302
    assert Task.objects.get().arguments == {"target": {"host": "db1"}}


def test_a_tool_with_an_odd_name_and_no_arguments_launches(client, operator):
    server = discovered_server()
    url = launch_url(server, "odd/name tool")
    assert "This tool takes no arguments." in page(client.get(url))
    response = client.post(url, {"mode": "form"})
    assert response.status_code == 302
    task = Task.objects.get()
    assert task.tool == "odd/name tool" and task.arguments == {}
    assert uuid.UUID(response["Location"].split("/")[2]) == task.id


def test_launch_on_a_server_disabled_meanwhile_is_refused(client, operator):
    server = discovered_server()
    page_html = page(client.get(launch_url(server, "approval")))
    assert "Launch" in page_html
    Server.objects.filter(pk=server.pk).update(enabled=False)
    assert client.post(launch_url(server, "approval"), {"mode": "form", "arg.action": "x"}).status_code == 403
    assert not Task.objects.exists()


def test_hostile_tool_entries_do_not_break_the_launch_pages(client, operator):
    server = discovered_server(
        tools=[*HOSTILE_TOOLS, {"name": "huge", "inputSchema": {"properties": {"a": {"enum": list(range(10_000))}}}}]
    )
    html = page(client.get(reverse("tasks:launch")))
    assert "<script>alert(2)" not in html and "&lt;script&gt;alert(2)&lt;/script&gt;" in html
    evil = page(client.get(launch_url(server, "evil")))
    assert "&lt;b&gt;x&lt;/b&gt;" in evil and "<b>x</b>" not in evil
    plain = page(client.get(launch_url(server, "plain")))
    assert "not a JSON object" in plain
    assert client.post(launch_url(server, "plain"), {"arguments_json": "{}"}).status_code == 400
    huge = page(client.get(launch_url(server, "huge")))
    assert "more than 500 values" in huge


def test_a_disabled_server_and_its_live_tasks_say_that_polling_is_paused(client, admin):
    from taskhub.mcp.client import TaskCreated
    from taskhub.mcp.wire import TaskSnapshot
    from taskhub.servers.services import update_server
    from taskhub.tasks import services

    server = discovered_server()
    task = services.launch(server=server, tool="approval", arguments={"action": "ship"}, user=admin)
    working = TaskSnapshot.model_validate({"taskId": "remote-1", "status": "working", "ttlMs": 60_000})
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=working))
    server_page, task_page = reverse("servers:detail", args=[server.pk]), reverse("tasks:detail", args=[task.pk])
    assert "Polling paused" not in page(client.get(task_page))
    assert "taskhub does not poll it" not in page(client.get(server_page))

    update_server(server=server, user=admin, enabled=False)
    html = page(client.get(server_page))
    assert "taskhub does not poll it" in html and "its 1 live task is paused" in html
    html = page(client.get(task_page))
    assert "Polling paused" in html and "the server demo is disabled" in html

    update_server(server=server, user=admin, enabled=True)
    assert "Polling paused" not in page(client.get(task_page))
