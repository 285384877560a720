"""Connect in the browser's two halves without a browser (issue 33 item 1): the Django test client is the admin,
httpx2 follows the authorization server's redirect as the browser would. The server is the demo MCP server behind
the test authorization server (tests/oauth_server.py): a real 401 challenge, real metadata, dynamic registration,
PKCE, `resource`, `iss`. An answer with a wrong state or a wrong issuer is refused with a message and changes
nothing; taskhub's Client ID Metadata Document is served where it has a public https address.
(The whole flow in a real browser, with a worker: tests/browser/test_oauth_connect.py.)"""

from __future__ import annotations

import logging
import re
from html import unescape
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2
import pytest
from django.test import Client
from django.urls import reverse

from taskhub.accounts.groups import ADMINS
from taskhub.audit.models import AuditEvent
from taskhub.servers.connect import store_of
from taskhub.servers.discovery import DiscoveryFailed, discover_and_record
from taskhub.servers.models import Server, ServerAuthorization
from taskhub.servers.services import create_server
from tests.account_fixtures import make_user
from tests.oauth_server import protecting
from tests.test_credentials_nowhere import every_text_logged

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def protected_demo(shared_demo_server):
    with protecting(shared_demo_server.url) as server:
        yield server


@pytest.fixture
def admin_browser():
    browser = Client()
    browser.force_login(make_user("alex", ADMINS))
    return browser


def added_and_challenged(protected_demo) -> Server:
    """The admin added the server by URL; its discovery met the 401 challenge."""
    server = create_server(name="guarded", transport="http", url=f"{protected_demo.url}/mcp", user=None)
    with pytest.raises(DiscoveryFailed, match="401"):
        discover_and_record(server=server)
    return Server.objects.get(pk=server.pk)


def start_connect(browser: Client, server: Server) -> str:
    """Connect: the page that moves on to the authorization server; returns the authorization URL."""
    response = browser.post(reverse("servers:connect", args=[server.pk]))
    assert response.status_code == 200, response.content
    page = response.content.decode()
    found = re.search(r'id="oauth-continue" href="([^"]+)"', page)
    assert found, page
    return unescape(found.group(1))


def approve(authorization_url: str) -> dict[str, str]:
    """What the authorization server sends the browser back with (its redirect's query)."""
    response = httpx2.get(authorization_url, follow_redirects=False)
    assert response.status_code in (302, 303, 307), response.text
    location = urlsplit(response.headers["location"])
    assert location.path == reverse("servers:oauth_callback")
    return {name: values[0] for name, values in parse_qs(location.query).items()}


def test_an_admin_connects_a_challenged_server_and_its_tools_are_discovered(protected_demo, admin_browser, caplog):
    caplog.set_level(logging.DEBUG)
    server = added_and_challenged(protected_demo)
    page = admin_browser.get(reverse("servers:detail", args=[server.pk])).content.decode()
    assert "Needs authorization" in page and "Connect</button>" in page

    authorization_url = start_connect(admin_browser, server)
    asked = {name: values[0] for name, values in parse_qs(urlsplit(authorization_url).query).items()}
    assert authorization_url.startswith(f"{protected_demo.url}/authorize?")
    assert asked["code_challenge_method"] == "S256" and asked["code_challenge"]
    assert asked["resource"] == f"{protected_demo.url}/mcp"  # RFC 8707
    assert asked["redirect_uri"] == "http://testserver/servers/oauth/callback"
    assert asked["client_id"] in protected_demo.provider.clients  # registered dynamically (RFC 7591)

    answer = approve(authorization_url)
    assert answer["iss"] == protected_demo.provider.issuer
    response = admin_browser.get(reverse("servers:oauth_callback"), answer)
    assert response.status_code == 302 and response["Location"] == reverse("servers:detail", args=[server.pk])

    server.refresh_from_db()
    assert server.oauth and server.discovery_pending_since is not None  # tools asked for again, in the background
    tokens = store_of(server).tokens_now()
    assert tokens is not None and tokens.access_token in protected_demo.provider.access
    row = ServerAuthorization.objects.get(server=server)
    assert row.needs_reauthorization_since is None
    event = AuditEvent.objects.get(action="server.connected")
    assert event.server_id == server.pk and event.actor.username == "alex"
    assert tokens.access_token not in str(event.data) and tokens.refresh_token not in str(event.data)

    # The discovery job's work, done here: through the one outbound path, with the kept token.
    discovery = discover_and_record(server=Server.objects.get(pk=server.pk))
    assert {tool["name"] for tool in discovery.tools} >= {"approval", "quick"}
    page = admin_browser.get(reverse("servers:detail", args=[server.pk])).content.decode()
    assert "Needs authorization" not in page and "connected</span>" in page

    # The callback is good once: the same answer again is refused.
    again = admin_browser.get(reverse("servers:oauth_callback"), answer)
    assert again.status_code == 400

    # Neither the tokens nor the client's registration secret nor the PKCE verifier are logged (DEBUG) or shown.
    shown = page + again.content.decode()
    client_secret = protected_demo.provider.clients[asked["client_id"]].client_secret
    secrets = [tokens.access_token, tokens.refresh_token, client_secret]
    logged = every_text_logged(caplog.records)
    assert all(secret and secret not in logged and secret not in shown for secret in secrets)


def test_an_answer_with_a_wrong_state_is_refused_and_changes_nothing(protected_demo, admin_browser):
    server = added_and_challenged(protected_demo)
    answer = approve(start_connect(admin_browser, server))
    before = ServerAuthorization.objects.values().get(server=server)

    forged = {**answer, "state": "not-the-state-we-sent"}
    response = admin_browser.get(reverse("servers:oauth_callback"), forged)
    assert response.status_code == 400
    assert "its state matches no Connect started in this browser" in response.content.decode()
    assert "Nothing was changed" in response.content.decode()
    assert ServerAuthorization.objects.values().get(server=server) == before
    assert not Server.objects.get(pk=server.pk).oauth
    assert not AuditEvent.objects.filter(action="server.connected").exists()


def test_an_answer_from_another_issuer_is_refused_and_changes_nothing(protected_demo, admin_browser):
    server = added_and_challenged(protected_demo)
    answer = approve(start_connect(admin_browser, server))
    before = ServerAuthorization.objects.values().get(server=server)

    mixed_up = {**answer, "iss": "https://attacker.example/"}  # RFC 9207: a mix-up attack's answer
    response = admin_browser.get(f"{reverse('servers:oauth_callback')}?{urlencode(mixed_up)}")
    assert response.status_code == 400
    page = response.content.decode()
    assert "another issuer (iss)" in page and "Nothing was changed" in page
    assert ServerAuthorization.objects.values().get(server=server) == before
    assert store_of(server).tokens_now() is None
    assert not AuditEvent.objects.filter(action="server.connected").exists()
    # The code was not exchanged: the authorization server still holds it.
    assert answer["code"] in protected_demo.provider.codes


def test_an_authorization_server_that_registers_no_client_asks_the_admin_for_one(protected_demo, admin_browser):
    server = added_and_challenged(protected_demo)
    protected_demo.provider.refuse_registration = True
    response = admin_browser.post(reverse("servers:connect", args=[server.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("servers:oauth_client", args=[server.pk])

    form = admin_browser.get(response["Location"]).content.decode()
    assert "http://testserver/servers/oauth/callback" in form
    protected_demo.provider.clients["registered-by-hand"] = protected_demo.provider.registered(
        client_id="registered-by-hand",
        client_secret="hand-secret",
        redirect_uri="http://testserver/servers/oauth/callback",
    )
    response = admin_browser.post(
        reverse("servers:oauth_client", args=[server.pk]),
        {"client_id": "registered-by-hand", "client_secret": "hand-secret"},
    )
    assert response.status_code == 200
    authorization_url = unescape(re.search(r'id="oauth-continue" href="([^"]+)"', response.content.decode()).group(1))
    assert "client_id=registered-by-hand" in authorization_url
    response = admin_browser.get(reverse("servers:oauth_callback"), approve(authorization_url))
    assert response.status_code == 302
    assert store_of(server).tokens_now() is not None


def test_the_client_id_metadata_document_is_served_at_its_own_url(settings):
    anyone = Client()
    url = reverse("servers:oauth_client_metadata")
    settings.TASKHUB_BASE_URL = ""
    assert anyone.get(url).status_code == 404  # no public https address: no document to point to
    settings.TASKHUB_BASE_URL = "https://hub.example"
    document = anyone.get(url).json()
    assert document["client_id"] == f"https://hub.example{url}"
    assert document["redirect_uris"] == ["https://hub.example/servers/oauth/callback"]
    assert document["token_endpoint_auth_method"] == "none"


def test_connect_asks_the_server_at_its_url_with_the_secret_query_values_it_needs(protected_demo, admin_browser):
    """A server whose URL carries a secret query value (kept apart, encrypted: taskhub/mcp/secret_urls.py) is asked
    by Connect as by every other request, with the value; its pages show it masked."""
    server = create_server(
        name="keyed-url", transport="http", url=f"{protected_demo.url}/mcp?token=url-secret-0042", user=None
    )
    assert "url-secret-0042" not in server.url and server.url_secrets == {"token": ["url-secret-0042"]}
    protected_demo.mcp_queries.clear()
    authorization_url = start_connect(admin_browser, server)
    assert authorization_url.startswith(f"{protected_demo.url}/authorize?")
    assert protected_demo.mcp_queries and all(query == "token=url-secret-0042" for query in protected_demo.mcp_queries)
    assert "url-secret-0042" not in admin_browser.get(reverse("servers:detail", args=[server.pk])).content.decode()
