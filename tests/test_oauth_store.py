"""A server's OAuth registration and tokens (issue 33 item 2): kept encrypted on ServerAuthorization through
taskhub.servers.oauth_store, bound to the server's resource, and shown nowhere: not in a pg_dump of the database, the
server's pages, Home, the audit export, /metrics or a log line at DEBUG."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken, ProtectedResourceMetadata
from pydantic import AnyUrl

from taskhub.accounts.groups import ADMINS
from taskhub.mcp.oauth import Discovery, KeptAuthorization
from taskhub.servers.models import ServerAuthorization
from taskhub.servers.oauth_store import DatabaseTokenStore
from taskhub.servers.services import create_server
from tests.account_fixtures import make_user
from tests.test_credentials_nowhere import every_text_logged
from tests.test_models_servers import pg_dump

URL = "https://mcp.example.com/mcp"
ACCESS = "access-5a1f-must-stay-secret"
REFRESH = "refresh-8c3d-must-stay-secret"
CLIENT_SECRET = "clientsecret-2b7e-must-stay-secret"
SECRETS = (ACCESS, REFRESH, CLIENT_SECRET)


def authorize(server_id: int, resource: str = URL) -> DatabaseTokenStore:
    store = DatabaseTokenStore(server_id=server_id, resource=resource)
    discovery = Discovery(
        protected_resource=ProtectedResourceMetadata(
            resource=AnyUrl(URL), authorization_servers=[AnyUrl("https://as.example.com")]
        ),
        authorization_server=OAuthMetadata(
            issuer=AnyUrl("https://as.example.com"),
            authorization_endpoint=AnyUrl("https://as.example.com/authorize"),
            token_endpoint=AnyUrl("https://as.example.com/token"),
        ),
        authorization_server_url="https://as.example.com",
    )
    client = OAuthClientInformationFull(
        client_id="taskhub-client", client_secret=CLIENT_SECRET, redirect_uris=[AnyUrl("https://taskhub/cb")]
    )

    async def keep() -> None:
        await store.set_discovery(discovery)
        await store.set_client_info(client)
        await store.set_tokens(
            OAuthToken(access_token=ACCESS, refresh_token=REFRESH, expires_in=3600, scope="tools:read")
        )

    async_to_sync(keep)()
    return store


@pytest.mark.django_db(transaction=True)
def test_the_store_keeps_registration_discovery_and_tokens_for_its_resource_only():
    server = create_server(name="guarded", transport="http", url=URL, user=None)
    store = authorize(server.pk)
    assert isinstance(store, KeptAuthorization)

    # Another process (a worker) reads what the web process stored.
    again = DatabaseTokenStore(server_id=server.pk, resource=URL)
    tokens = async_to_sync(again.get_tokens)()
    assert tokens is not None and tokens.access_token == ACCESS and tokens.refresh_token == REFRESH
    assert tokens.scope == "tools:read"
    expires_at = async_to_sync(again.get_expires_at)()
    assert expires_at is not None
    client = async_to_sync(again.get_client_info)()
    assert client is not None and client.client_secret == CLIENT_SECRET
    discovery = async_to_sync(again.get_discovery)()
    assert discovery is not None and str(discovery.authorization_server.token_endpoint).endswith("/token")

    # Bound to the resource: a store for another URL of the same server sees nothing, and what it stores replaces
    # the old authorization rather than mixing with it.
    elsewhere = DatabaseTokenStore(server_id=server.pk, resource="https://other.example.com/mcp")
    assert async_to_sync(elsewhere.get_tokens)() is None
    assert async_to_sync(elsewhere.get_client_info)() is None
    async_to_sync(elsewhere.set_tokens)(OAuthToken(access_token="other-access"))
    row = ServerAuthorization.objects.get(server=server)
    assert row.resource == "https://other.example.com/mcp" and row.client_info == {}
    assert async_to_sync(again.get_tokens)() is None

    for secret in SECRETS:
        assert secret not in repr(store) and secret not in repr(row) and secret not in str(row)


@pytest.mark.django_db(transaction=True)
def test_oauth_tokens_appear_in_no_dump_page_export_metric_or_log(caplog, settings):
    caplog.set_level(logging.DEBUG)
    admin = make_user("alex", ADMINS)
    server = create_server(name="guarded", transport="http", url=URL, user=admin)
    authorize(server.pk)

    dump = pg_dump()
    assert "as.example.com" not in dump  # the discovered metadata too is encrypted
    assert "servers_serverauthorization" in dump  # the dump did include the row
    for secret in SECRETS:
        assert secret not in dump

    browser = Client()
    browser.force_login(admin)
    shown = []
    for url in (
        reverse("servers:detail", args=[server.pk]),
        reverse("servers:edit", args=[server.pk]),
        reverse("servers:list"),
        "/",
        reverse("audit:export", args=["csv"]),
        reverse("audit:export", args=["json"]),
    ):
        response = browser.get(url)
        assert response.status_code == 200, url
        shown.append(b"".join(response) if response.streaming else response.content)
    shown.append(scrape_metrics(Client(), settings).content)
    everything = b"\n".join(shown).decode() + every_text_logged(caplog.records)
    for secret in SECRETS:
        assert secret not in everything


def scrape_metrics(client, settings):
    settings.TASKHUB_METRICS_TOKEN = "metrics-scraper"
    settings.TASKHUB_METRICS_ALLOWED_NETWORKS = []
    response = client.get("/metrics", headers={"Authorization": "Bearer metrics-scraper"})
    assert response.status_code == 200, response.content
    return response
