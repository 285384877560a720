"""Several processes find a server's access token expired at once (issue 33 item 3, acceptance b): exactly one
refresh request reaches the authorization server, and every one of them then sends its request with the token that
refresh stored. Three providers on their own DatabaseTokenStore stand for two workers and the web process; the lock
is the store's Postgres advisory lock, taken on connections of their own as separate processes would."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from django.urls import reverse
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from pydantic import AnyUrl

from taskhub.accounts.groups import ADMINS
from taskhub.mcp.oauth import AuthorizationProblem, Discovery, OAuthClientSettings, SharedRefresh, oauth_provider
from taskhub.mcp.outbound import Outbound
from taskhub.servers.models import Server, ServerAuthorization
from taskhub.servers.oauth_store import DatabaseTokenStore
from taskhub.servers.services import create_server
from tests.account_fixtures import make_user
from tests.oauth_server import AuthorizationServer
from tests.test_oauth_store import scrape_metrics

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT_ID = "taskhub-race"
CLIENT_SECRET = "race-secret"


class NoPerson:
    """The race needs no person: a flow that asked one would fail the test."""

    redirect_uri = "http://127.0.0.1/oauth/callback"

    async def redirect_handler(self, authorization_url: str) -> None:
        raise AssertionError("a person was asked to authorize")

    async def callback_handler(self) -> AuthorizationCodeResult:
        raise AssertionError("a person was asked to authorize")


@pytest.fixture
def authorization_server():
    server = AuthorizationServer()
    server.start()
    yield server
    server.stop()


def connected_with_an_expired_token(authorization_server) -> tuple[str, Server, DatabaseTokenStore]:
    """(resource URL, server, its store): a server connected to the test authorization server's protected resource,
    its discovery and registration kept, and an access token that expired a moment ago (as the store sees it) with a
    refresh token the authorization server issued."""
    issuer = authorization_server.url
    resource = f"{issuer}/resource"
    authorization_server.provider.clients[CLIENT_ID] = OAuthClientInformationFull(
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        redirect_uris=[AnyUrl(NoPerson.redirect_uri)],
        token_endpoint_auth_method="client_secret_post",
        grant_types=["authorization_code", "refresh_token"],
    )
    server = create_server(name="guarded", transport="http", url=resource, user=None)
    store = DatabaseTokenStore(server_id=server.pk, resource=resource)
    issued = authorization_server.provider.issue(client_id=CLIENT_ID)

    async def seed() -> None:
        await store.set_discovery(
            Discovery(
                protected_resource=ProtectedResourceMetadata(
                    resource=AnyUrl(resource), authorization_servers=[AnyUrl(issuer)]
                ),
                authorization_server=OAuthMetadata(
                    issuer=AnyUrl(issuer),
                    authorization_endpoint=AnyUrl(f"{issuer}/authorize"),
                    token_endpoint=AnyUrl(f"{issuer}/token"),
                ),
                authorization_server_url=issuer,
            )
        )
        await store.set_client_info(authorization_server.provider.clients[CLIENT_ID])
        await store.set_tokens(OAuthToken(access_token="expired", refresh_token=issued.refresh_token, expires_in=-1))

    async_to_sync(seed)()
    return resource, server, store


def test_one_refresh_reaches_the_authorization_server_when_three_processes_race(authorization_server):
    resource, server, store = connected_with_an_expired_token(authorization_server)
    assert isinstance(store, SharedRefresh)

    async def one_process() -> int:
        provider = oauth_provider(
            server_url=resource,
            settings=OAuthClientSettings(
                client_id=CLIENT_ID, client_secret=CLIENT_SECRET, client_auth="client_secret_post"
            ),
            storage=DatabaseTokenStore(server_id=server.pk, resource=resource),
            redirect=NoPerson(),
        )
        async with Outbound(None).httpx_client(auth=provider, timeout=30.0) as client:
            response = await client.get(resource)
        assert provider.failure_message() is None
        return response.status_code

    async def race() -> list[int]:
        return list(await asyncio.gather(one_process(), one_process(), one_process()))

    assert async_to_sync(race)() == [200, 200, 200]
    assert authorization_server.provider.refresh_requests == 1
    kept = async_to_sync(store.get_tokens)()
    assert kept is not None and kept.access_token in authorization_server.provider.access


def test_a_connected_servers_target_refreshes_its_token_and_marks_a_refused_refresh(authorization_server, settings):
    """The one outbound path (Server.to_target): an expired token is refreshed unnoticed; once the authorization
    server has revoked the refresh token, the server is marked as needing re-authorization and nobody is asked."""
    resource, server, _ = connected_with_an_expired_token(authorization_server)

    async def call() -> int:
        target = await sync_to_async(lambda: Server.objects.get(pk=server.pk).to_target())()
        assert target.auth is not None
        async with Outbound(None).httpx_client(auth=target.auth, timeout=30.0) as client:
            try:
                return (await client.get(resource)).status_code
            except AuthorizationProblem:
                return -1

    assert async_to_sync(call)() == 200
    assert authorization_server.provider.refresh_requests == 1
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is None

    authorization_server.provider.revoke_all()
    ServerAuthorization.objects.filter(server=server).update(expires_at=0)
    assert async_to_sync(call)() == -1
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is not None

    # Its page says so, and /metrics counts it.
    admin = make_user("alex", ADMINS)
    browser = Client()
    browser.force_login(admin)
    page = browser.get(reverse("servers:detail", args=[server.pk])).content.decode()
    assert "Needs re-authorization" in page
    metrics = scrape_metrics(browser, settings).content.decode()
    assert "taskhub_servers_needing_reauthorization 1.0" in metrics
