"""Where MCP servers may live: link-local and cloud metadata addresses and taskhub's own database and Redis are
refused at registration (form, `manage.py server`, services) and at every connection, on the addresses a name
resolves to then; a reply that is not MCP is quoted in errors by a short, printable excerpt at most."""

from __future__ import annotations

import io
import json
import uuid

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.mcp.address_policy import AddressRefused
from taskhub.mcp.errors import AuthorizationFailed
from taskhub.mcp.lean import LeanTaskGetter
from taskhub.servers.discovery import DiscoveryFailed, discover_and_record
from taskhub.servers.errors import ServerConfigInvalid
from taskhub.servers.models import Server
from taskhub.servers.services import create_server, update_server
from taskhub.tasks import services as task_services
from taskhub.tasks.models import Task
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.threaded_app import ThreadedApp

pytestmark = pytest.mark.django_db(transaction=True)

LOOPBACK_DENIED = {"TASKHUB_SERVER_DENIED_NETWORKS": ["127.0.0.0/8", "::1/128"]}


def database_url() -> str:
    settings = connection.settings_dict
    return f"http://{settings['HOST']}:{settings['PORT'] or 5432}/mcp"


DENIED = [
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.10.20:8000/mcp",
    "http://[fd00:ec2::254]/latest",
    "http://[fe80::1]:8080/mcp",
    "http://[::ffff:169.254.169.254]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://METADATA.google.internal./computeMetadata/v1/",
    "http://metadata/computeMetadata/v1/",
    "database",
    "http://127.0.0.1:6379/mcp",  # REDIS_URL below
    # "This host" and IPv6 forms of it reach the same Redis (issue 31, item 3).
    "http://0.0.0.0:6379/mcp",
    "http://[::ffff:0.0.0.0]:6379/mcp",
    "http://[::ffff:127.0.0.1]:6379/mcp",
    "http://[2002:7f00:1::]:6379/mcp",  # 6to4 of 127.0.0.1
]


@pytest.fixture
def denied_url(request):
    return database_url() if request.param == "database" else request.param


@pytest.mark.parametrize("denied_url", DENIED, indirect=True)
@override_settings(REDIS_URL="redis://127.0.0.1:6379/0")
def test_a_denied_address_is_refused_at_registration_by_form_command_and_service(denied_url):
    admin = make_user("alex", ADMINS)
    browser = Client()
    browser.force_login(admin)
    page = browser.post(reverse("servers:add"), {"name": "meta", "transport": "http", "url": denied_url})
    assert page.status_code == 400
    assert "Not an address for MCP servers" in page.context["form"].errors["url"][0]
    with pytest.raises(CommandError, match="address policy refuses"):
        call_command("server", "add", "meta", "--url", denied_url, stdout=io.StringIO())
    with pytest.raises(ServerConfigInvalid, match="address policy refuses"):
        create_server(name="meta", transport="http", url=denied_url, user=admin)
    allowed = create_server(name="fine", transport="http", url="http://127.0.0.1:8765/mcp", user=admin)
    with pytest.raises(ServerConfigInvalid, match="address policy refuses"):
        update_server(server=allowed, user=admin, url=denied_url)
    assert not Server.objects.exclude(name="fine").exists()
    assert Server.objects.get(name="fine").url == "http://127.0.0.1:8765/mcp"


def test_loopback_and_private_ranges_are_allowed_by_default_and_can_be_denied():
    create_server(name="local", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    create_server(name="internal", transport="http", url="https://10.1.2.3/mcp", user=None)
    create_server(name="named", transport="http", url="http://localhost:8765/mcp", user=None)
    with override_settings(**LOOPBACK_DENIED):
        for url in (
            "http://127.0.0.2:8765/mcp",
            "http://[::1]:8765/mcp",
            "http://localhost:8765/mcp",
            "http://0.0.0.0:8765/mcp",  # "this host": a connection to it reaches loopback
            "http://0.1.2.3:8765/mcp",
            "http://[::]:8765/mcp",
            "http://[::ffff:0.0.0.0]:8765/mcp",
        ):
            with pytest.raises(ServerConfigInvalid, match="address policy refuses"):
                create_server(name="more", transport="http", url=url, user=None)
    with override_settings(TASKHUB_SERVER_ALLOWED_NETWORKS=["10.0.0.0/8"]):
        with pytest.raises(ServerConfigInvalid, match="not in an allowed network"):
            create_server(name="more", transport="http", url="http://192.168.1.1/mcp", user=None)
        create_server(name="more", transport="http", url="http://10.9.9.9/mcp", user=None)


def poll_once(server: Server) -> None:
    """One tasks/get on the lean poll path (aiohttp, then the raw pool), as the tracker sends it."""

    async def poll() -> None:
        getter = LeanTaskGetter(server.to_target(), timeout=5)
        try:
            await getter.get_task("t-1")
        finally:
            await getter.aclose()

    async_to_sync(poll)()


def recording_server(seen: list[Request]) -> ThreadedApp:
    async def answer(request: Request) -> Response:
        seen.append(request)
        return Response(b"no", status_code=401)

    return ThreadedApp(Starlette(routes=[Route("/mcp", answer, methods=["GET", "POST", "DELETE"])]))


def test_a_name_that_resolves_to_a_denied_address_is_refused_at_each_connection():
    operator = make_user("olga", OPERATORS)
    seen: list[Request] = []
    recorder = recording_server(seen)
    port = recorder.start()
    try:
        # Registered while allowed; the name is checked again, resolved, at every connection.
        server = create_server(name="named", transport="http", url=f"http://localhost:{port}/mcp", user=None)
        with pytest.raises(DiscoveryFailed, match="401"):
            discover_and_record(server=server)
        assert seen and seen[0].headers["host"] == f"localhost:{port}", "the SDK path: sent to the checked address"
        discovered = len(seen)

        with pytest.raises(AuthorizationFailed):  # the lean path's checked resolver, while allowed
            poll_once(server)
        assert len(seen) > discovered and all(request.headers["host"] == f"localhost:{port}" for request in seen)
        seen.clear()

        with override_settings(**LOOPBACK_DENIED):
            with pytest.raises(DiscoveryFailed, match="address policy refuses localhost") as refused:
                discover_and_record(server=server)
            assert "resolved to 127.0.0.1" in str(refused.value)
            server.refresh_from_db()
            assert "address policy refuses" in server.last_error
            with pytest.raises(AddressRefused):
                poll_once(server)

        literal = create_server(name="literal", transport="http", url=f"http://127.0.0.1:{port}/mcp", user=None)
        with override_settings(**LOOPBACK_DENIED):
            with pytest.raises(AddressRefused):
                poll_once(literal)
            task = task_services.launch(server=with_tools(server, "work"), tool="work", arguments={}, user=operator)
            async_to_sync(jobs.launch)(task.id)
    finally:
        recorder.stop()
    task = Task.objects.get(pk=task.id)
    assert task.status == "failed" and "address policy refuses" in task.error["message"]
    assert not seen, "nothing was sent to a refused address"


@override_settings(REDIS_URL="redis://127.0.0.1:6379/0")
def test_this_host_is_refused_as_a_webhook_where_loopback_is():
    from taskhub.approvals.services import create_policy
    from taskhub.approvals.webhooks import WebhookInvalid, create_webhook

    server = create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    policy = create_policy(server=server, users=[], user=None)
    for url in ("http://0.0.0.0:6379/hook", "http://[::ffff:0.0.0.0]:6379/hook"):
        with pytest.raises(WebhookInvalid, match="taskhub's own services"):
            create_webhook(policy=policy, url=url, secret="s" * 32, user=None)
    with override_settings(**LOOPBACK_DENIED), pytest.raises(WebhookInvalid, match=r"reaches 127\.0\.0\.1"):
        create_webhook(policy=policy, url="http://0.0.0.0:9999/hook", secret="s" * 32, user=None)


def test_this_host_registered_while_allowed_is_refused_at_each_connection_once_loopback_is_denied():
    seen: list[Request] = []
    recorder = recording_server(seen)
    port = recorder.start()
    try:
        server = create_server(name="zeros", transport="http", url=f"http://0.0.0.0:{port}/mcp", user=None)

        with pytest.raises(AuthorizationFailed):  # allowed: 0.0.0.0 reaches the listener on 127.0.0.1
            poll_once(server)
        reached = len(seen)
        assert reached
        with override_settings(**LOOPBACK_DENIED):
            with pytest.raises(AddressRefused, match=r"reaches 127\.0\.0\.1"):
                poll_once(server)
            with pytest.raises(DiscoveryFailed, match="address policy refuses"):
                discover_and_record(server=Server.objects.get(pk=server.pk))
    finally:
        recorder.stop()
    assert len(seen) == reached, "nothing was sent to a refused address"


NOT_MCP = {"jsonrpc": "2.0", "id": None, "result": {"leak": "ECHO" + "z" * 500 + "\x1b[2J\x07"}}
PLAIN_JSON = {"service": "something else", "leak": "ECHO" + "z" * 500 + "\u202e\x1b[2J"}


def not_mcp_server(body: dict) -> ThreadedApp:
    """Answers every request at once with `body` (given the request's id when it has one): JSON, but not MCP."""

    async def answer(request: Request) -> Response:
        sent = await request.body()
        reply = dict(body)
        if "id" in reply and sent:
            reply["id"] = json.loads(sent).get("id")
        return Response(json.dumps(reply), media_type="application/json")

    return ThreadedApp(Starlette(routes=[Route("/mcp", answer, methods=["GET", "POST", "DELETE"])]))


@pytest.mark.parametrize("body", [NOT_MCP, PLAIN_JSON], ids=["json-rpc-but-not-mcp", "plain-json"])
def test_a_reply_that_is_not_mcp_is_quoted_by_a_short_printable_excerpt_at_most(body):
    operator = make_user("olga", OPERATORS)
    recorder = not_mcp_server(body)
    port = recorder.start()
    try:
        server = create_server(name="other", transport="http", url=f"http://127.0.0.1:{port}/mcp", user=None)
        with pytest.raises(DiscoveryFailed):
            discover_and_record(server=server)
        task = task_services.launch(server=with_tools(server, "work"), tool="work", arguments={}, user=operator)
        async_to_sync(jobs.launch)(task.id)
    finally:
        recorder.stop()
    server.refresh_from_db()
    task = Task.objects.get(pk=task.id)
    assert server.last_error and task.status == "failed"
    for text in (server.last_error, task.error["message"], task.status_message):
        # Our words (what was asked, where) and at most an 80-character excerpt of the reply.
        assert len(text) <= 300 and text.count("z") <= 80, text
        assert not any(char in text for char in "\x1b\x07\u202e"), text
        assert "\\x1b" not in text and "\\u202e" not in text, text


# Every spelling of "this host" (and one of loopback) that reaches a listener on 127.0.0.1 without naming it. ("0"
# alone is no valid URL: refused as such.)
THIS_HOST_SPELLINGS = ["0.0.0.0", "[::ffff:0.0.0.0]", "[::ffff:127.0.0.1]", "[::]", "[::ffff:0:0]"]


@pytest.mark.parametrize("host", THIS_HOST_SPELLINGS)
def test_each_spelling_of_this_host_is_refused_on_every_outbound_path_once_loopback_is_denied(host):
    """Issue 31, point 3, table-driven: at registration (a server, a webhook) and at connection time through the SDK's
    HTTP stack (discovery, over httpx2), the lean poll (aiohttp, and the raw pool after it) and a webhook's POST
    (httpx2); a listener on 127.0.0.1 hears nothing."""
    from taskhub.approvals.services import create_policy
    from taskhub.approvals.webhooks import Attempt, WebhookInvalid, create_webhook, post

    seen: list[Request] = []
    recorder = recording_server(seen)
    port = recorder.start()
    url = f"http://{host}:{port}/mcp"
    try:
        server = create_server(name="zeros", transport="http", url=url, user=None)  # allowed while loopback is
        policy = create_policy(server=server, users=[], user=None)
        with override_settings(**LOOPBACK_DENIED):
            with pytest.raises(ServerConfigInvalid, match="address policy refuses"):
                create_server(name="again", transport="http", url=url, user=None)
            with pytest.raises(WebhookInvalid, match="address policy refuses"):
                create_webhook(policy=policy, url=url, secret="s" * 32, user=None)
            with pytest.raises(DiscoveryFailed, match="address policy refuses"):
                discover_and_record(server=Server.objects.get(pk=server.pk))

            with pytest.raises(AddressRefused):
                poll_once(server)
            attempt = Attempt(delivery_id=uuid.uuid4(), url=url, headers={}, body=b"{}")
            outcome = async_to_sync(post)(attempt, timeout=5)
            assert outcome.http_status is None and "address policy refuses" in outcome.excerpt
    finally:
        recorder.stop()
    assert seen == [], "nothing reached the listener on loopback"
