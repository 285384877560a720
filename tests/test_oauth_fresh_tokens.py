"""A connected server's tokens kept fresh by whoever calls it (issue 33 item 3): a token close to its expiry is
refreshed before it is sent, a token the server refuses before its time (a 401) is refreshed and the call sent once
more, and a refresh the authorization server refuses marks the server as needing re-authorization after one attempt.
Real calls (server/discover, tools/call, tasks/get) through Server.to_target(), the one outbound path the workers
use, to the demo MCP server behind the test authorization server (tests/oauth_server.py)."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata
from pydantic import AnyUrl

from taskhub.accounts.groups import ADMINS
from taskhub.approvals.models import MailEvent, NotificationKind
from taskhub.approvals.notifications import digest
from taskhub.mcp.client import TasksClient
from taskhub.mcp.lean import task_getter
from taskhub.mcp.oauth import Discovery
from taskhub.servers.models import Server, ServerAuthorization
from taskhub.servers.oauth_store import DatabaseTokenStore
from taskhub.servers.services import create_server
from tests.account_fixtures import make_user
from tests.helpers import let_time_pass_async
from tests.oauth_server import protecting

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT_ID = "taskhub-fresh"
CLIENT_SECRET = "fresh-secret"
LIFETIME = 30  # seconds an access token lives: refreshed 6 s (a fifth) before it expires


@pytest.fixture
def protected_demo(shared_demo_server):
    with protecting(shared_demo_server.url, access_expires_in=LIFETIME) as server:
        yield server


def connected(protected_demo, *, expires_in_s: float) -> tuple[Server, DatabaseTokenStore, str]:
    """A server connected to the demo behind the authorization server: its discovery and registration kept, and a
    token the authorization server issued whose expiry the store puts `expires_in_s` from now. (server, store,
    the kept access token)."""
    issuer = protected_demo.url
    resource = f"{issuer}/mcp"
    protected_demo.provider.clients[CLIENT_ID] = protected_demo.provider.registered(
        client_id=CLIENT_ID, client_secret=CLIENT_SECRET, redirect_uri="http://testserver/servers/oauth/callback"
    )
    server = create_server(name="guarded", transport="http", url=resource, user=None)
    store = DatabaseTokenStore(server_id=server.pk, resource=resource)
    issued = protected_demo.provider.issue(client_id=CLIENT_ID, access_expires_in=LIFETIME)

    async def seed() -> None:
        await store.set_discovery(
            Discovery(
                protected_resource=ProtectedResourceMetadata(
                    resource=AnyUrl(resource), authorization_servers=[AnyUrl(f"{issuer}/")]
                ),
                authorization_server=OAuthMetadata(
                    issuer=AnyUrl(f"{issuer}/"),
                    authorization_endpoint=AnyUrl(f"{issuer}/authorize"),
                    token_endpoint=AnyUrl(f"{issuer}/token"),
                ),
                authorization_server_url=f"{issuer}/",
            )
        )
        await store.set_client_info(protected_demo.provider.clients[CLIENT_ID])
        await store.set_tokens(issued)

    async_to_sync(seed)()
    ServerAuthorization.objects.filter(server=server).update(expires_at=time.time() + expires_in_s)
    return Server.objects.get(pk=server.pk), store, issued.access_token


def discover(server: Server) -> list[str]:
    async def ask() -> list[str]:
        async with TasksClient(server.to_target(), timeout=15) as client:
            return [tool["name"] for tool in (await client.discover()).tools]

    return async_to_sync(ask)()


def test_a_token_close_to_its_expiry_is_refreshed_before_it_is_sent(protected_demo):
    server, store, first = connected(protected_demo, expires_in_s=3)  # within the last fifth of its life

    assert "quick" in discover(server)
    assert protected_demo.provider.refresh_requests == 1
    assert protected_demo.mcp_refusals == 0  # the old token was never sent
    kept = store.tokens_now()
    assert kept is not None and kept.access_token != first and kept.access_token in protected_demo.provider.access

    # Fresh now (30 s to go): the next calls send it as it is.
    assert "quick" in discover(Server.objects.get(pk=server.pk))
    assert protected_demo.provider.refresh_requests == 1


def test_a_token_refused_before_its_time_is_refreshed_and_the_call_sent_once_more(protected_demo):
    server, store, first = connected(protected_demo, expires_in_s=LIFETIME)
    del protected_demo.provider.access[first]  # the authorization server forgot it (revoked, restarted)

    assert "quick" in discover(server)
    assert protected_demo.mcp_refusals == 1  # the refused call, then the same call with the new token
    assert protected_demo.provider.refresh_requests == 1
    assert store.tokens_now().access_token in protected_demo.provider.access
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is None


def test_the_tracker_polls_a_connected_server_with_its_token(protected_demo):
    """tasks/get of the tracker (task_getter) goes through the same provider, not the lean header-only path."""
    server, _, first = connected(protected_demo, expires_in_s=LIFETIME)

    async def launch_and_poll() -> str:
        async with TasksClient(server.to_target(), timeout=15) as client:
            created = await client.call_tool("approval", {"action": "deploy"})  # waits for an answer
        getter = task_getter(server.to_target(), timeout=15)
        try:
            del protected_demo.provider.access[first]  # refused once: refreshed and asked again
            snapshot = await getter.get_task(created.task.task_id)
        finally:
            await getter.aclose()
        return snapshot.status

    assert async_to_sync(launch_and_poll)() in ("working", "input_required")
    assert protected_demo.provider.refresh_requests == 1


def test_a_refused_refresh_marks_the_server_after_one_attempt_and_tells_the_admins(protected_demo):
    admin = make_user("alex", ADMINS, email="alex@example.com")
    make_user("ada", ADMINS)  # no address: not mailed
    server, _, _ = connected(protected_demo, expires_in_s=LIFETIME)
    protected_demo.provider.revoke_all()

    with pytest.raises(Exception, match="connect it again"):
        discover(server)
    assert protected_demo.provider.refresh_requests == 1
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is not None
    with pytest.raises(Exception, match="connect it again"):
        discover(Server.objects.get(pk=server.pk))  # marked once, announced once

    # The admins' mail: one event each, and the digest says which server and links to its page (Connect).
    events = list(MailEvent.objects.filter(kind=NotificationKind.SERVER_NEEDS_AUTHORIZATION))
    assert [event.user_id for event in events] == [admin.pk]
    mail = digest.build(admin, events)
    assert mail.subject == "taskhub: 1 server needs an admin to connect it again"
    assert "guarded: its OAuth token could not be refreshed" in mail.body
    assert f"/servers/{server.pk}/" in mail.body

    # Home says so too.
    browser = Client()
    browser.force_login(admin)
    home = browser.get("/").content.decode()
    assert "needs re-authorization" in home and f"/servers/{server.pk}/" in home


def test_a_client_that_read_a_token_before_another_process_refreshed_it_uses_the_new_one(protected_demo):
    """A long-lived client (the tracker's) whose token another process refreshed meanwhile (and so spent its
    rotated refresh token) sends the stored token, instead of refreshing again with the spent one."""
    server, _, _ = connected(protected_demo, expires_in_s=8)  # due for refresh 2 s from now (6 s ahead)

    async def two_processes() -> None:
        async with TasksClient(server.to_target(), timeout=15) as long_lived:
            await long_lived.discover()  # reads the token, still fresh
            await let_time_pass_async(2.5, because="the token must come due for its refresh")
            async with TasksClient(server.to_target(), timeout=15) as other:
                await other.discover()  # the other process refreshes it
            assert protected_demo.provider.refresh_requests == 1
            await long_lived.discover()

    async_to_sync(two_processes)()
    assert protected_demo.provider.refresh_requests == 1
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is None
