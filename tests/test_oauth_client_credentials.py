"""Without a person (issue 33 item 5): an admin gives a server the client id and secret of a client registered for the
client credentials grant; taskhub then gets the server's tokens itself on its first request and again when one is
due, never asking anyone and never marking the server. The secret is kept encrypted and shown nowhere."""

from __future__ import annotations

import logging
import time

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from taskhub.accounts.groups import ADMINS
from taskhub.audit.models import AuditEvent
from taskhub.servers.connect import store_of
from taskhub.servers.models import Server, ServerAuthorization
from taskhub.servers.services import create_server
from tests.account_fixtures import make_user
from tests.oauth_server import protecting
from tests.test_credentials_nowhere import every_text_logged
from tests.test_oauth_fresh_tokens import discover

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "robot-secret-must-stay-hidden"


@pytest.fixture
def protected_demo(shared_demo_server):
    with protecting(shared_demo_server.url, access_expires_in=30) as server:
        yield server


def test_a_server_with_client_credentials_gets_and_renews_its_tokens_itself(protected_demo, caplog):
    caplog.set_level(logging.DEBUG)
    protected_demo.provider.clients["robot"] = protected_demo.provider.registered(
        client_id="robot", client_secret=SECRET, redirect_uri="http://unused.example/cb"
    )
    server = create_server(name="machine", transport="http", url=f"{protected_demo.url}/mcp", user=None)
    admin = Client()
    admin.force_login(make_user("alex", ADMINS))

    response = admin.post(
        reverse("servers:oauth_client", args=[server.pk]),
        {"client_id": "robot", "client_secret": SECRET, "client_credentials": "on"},
    )
    assert response.status_code == 302 and response["Location"] == reverse("servers:detail", args=[server.pk])
    server = Server.objects.get(pk=server.pk)
    assert server.oauth and server.oauth_client_credentials and server.discovery_pending_since is not None
    event = AuditEvent.objects.get(action="server.connected")
    assert event.data["grant"] == "client_credentials" and SECRET not in str(event.data)

    # The first request gets a token with the client credentials, nobody asked.
    assert "quick" in discover(server)
    assert protected_demo.provider.client_credentials_requests == 1
    first = store_of(server).tokens_now()
    assert first is not None and first.access_token in protected_demo.provider.access

    # A token due for renewal is renewed the same way.
    ServerAuthorization.objects.filter(server=server).update(expires_at=time.time() + 3)
    assert "quick" in discover(Server.objects.get(pk=server.pk))
    assert protected_demo.provider.client_credentials_requests == 2
    assert store_of(server).tokens_now().access_token != first.access_token
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is None

    page = admin.get(reverse("servers:detail", args=[server.pk])).content.decode()
    assert "connected" in page
    kept = store_of(server).tokens_now().access_token
    for secret in (SECRET, kept, first.access_token):
        assert secret not in page and secret not in every_text_logged(caplog.records)


def test_client_credentials_the_authorization_server_refuses_mark_the_server_until_an_admin_enters_them_again(
    protected_demo,
):
    """A secret rotated at the authorization server: the token request is refused, the server is marked as needing
    an admin (its launches and answers wait, as after a failed refresh) rather than its work failing; entering the
    client again clears the mark and the next request gets a token."""
    protected_demo.provider.clients["robot"] = protected_demo.provider.registered(
        client_id="robot", client_secret=SECRET, redirect_uri="http://unused.example/cb"
    )
    server = create_server(name="rotated", transport="http", url=f"{protected_demo.url}/mcp", user=None)
    admin = Client()
    admin.force_login(make_user("alex", ADMINS))
    form = {"client_id": "robot", "client_secret": "an-old-secret", "client_credentials": "on"}
    assert admin.post(reverse("servers:oauth_client", args=[server.pk]), form).status_code == 302

    with pytest.raises(Exception):  # noqa: B017 - whatever the client wraps the refusal in
        discover(Server.objects.get(pk=server.pk))
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is not None
    assert protected_demo.provider.client_credentials_requests == 0  # refused: none granted

    form["client_secret"] = SECRET
    assert admin.post(reverse("servers:oauth_client", args=[server.pk]), form).status_code == 302
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is None
    assert "quick" in discover(Server.objects.get(pk=server.pk))
    assert protected_demo.provider.client_credentials_requests == 1


def key_pair() -> tuple[str, str]:
    """A P-256 key pair, PEM: (private, public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


def test_a_server_with_a_private_key_client_gets_its_tokens_with_jwt_assertions_and_the_key_shows_nowhere(
    protected_demo, caplog
):
    """The same without a secret: the admin pastes the PEM private key of a client registered with its public key
    (private_key_jwt, RFC 7523). Each token request carries an assertion signed with it; a key the authorization
    server does not know marks the server until the admin enters the client again; a key that is not one is refused
    on the form and changes nothing."""
    caplog.set_level(logging.DEBUG)
    private, public = key_pair()
    protected_demo.provider.client_keys["robot-key"] = public
    server = create_server(name="keyed", transport="http", url=f"{protected_demo.url}/mcp", user=None)
    admin = Client()
    admin.force_login(make_user("alex", ADMINS))
    url = reverse("servers:oauth_client", args=[server.pk])

    refused = admin.post(url, {"client_id": "robot-key", "private_key": "not a key", "client_credentials": "on"})
    assert refused.status_code == 400 and "not an unencrypted PEM private key" in refused.content.decode()
    assert not Server.objects.get(pk=server.pk).oauth and not ServerAuthorization.objects.filter(server=server).exists()
    without_person = admin.post(url, {"client_id": "robot-key", "private_key": private})
    assert without_person.status_code == 400 and "No person" in without_person.content.decode()

    form = {"client_id": "robot-key", "private_key": private, "client_credentials": "on"}
    assert admin.post(url, form).status_code == 302
    server = Server.objects.get(pk=server.pk)
    assert server.oauth and server.oauth_client_credentials and server.oauth_client_private_key
    assert "quick" in discover(server)
    assert protected_demo.provider.client_credentials_requests == 1
    first = store_of(server).tokens_now()
    ServerAuthorization.objects.filter(server=server).update(expires_at=time.time() + 3)  # due: renewed by itself
    assert "quick" in discover(Server.objects.get(pk=server.pk))
    assert protected_demo.provider.client_credentials_requests == 2
    assert store_of(server).tokens_now().access_token != first.access_token

    # Kept encrypted; on no page, in no log line, in no audit row.
    with connection.cursor() as cursor:
        cursor.execute("SELECT client_key::text FROM servers_serverauthorization WHERE server_id = %s", [server.pk])
        (stored,) = cursor.fetchone()
    body = private.splitlines()[1]  # a line of the key's base64
    assert body not in stored and "PRIVATE KEY" not in stored
    event = AuditEvent.objects.filter(action="server.connected").latest("id")
    assert event.data["client_auth"] == "private_key_jwt" and body not in str(event.data)
    for page in (admin.get(reverse("servers:detail", args=[server.pk])), admin.get(url)):
        assert body not in page.content.decode()
    assert body not in every_text_logged(caplog.records)

    # The authorization server no longer knows the key (rotated there): the server waits for an admin.
    protected_demo.provider.client_keys["robot-key"] = key_pair()[1]
    ServerAuthorization.objects.filter(server=server).update(expires_at=time.time() - 1)
    with pytest.raises(Exception):  # noqa: B017 - whatever the client wraps the refusal in
        discover(Server.objects.get(pk=server.pk))
    assert ServerAuthorization.objects.get(server=server).needs_reauthorization_since is not None
    protected_demo.provider.client_keys["robot-key"] = public
    assert admin.post(url, form).status_code == 302
    assert "quick" in discover(Server.objects.get(pk=server.pk))
