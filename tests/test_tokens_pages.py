"""API tokens on a page (issue 15 item 8): create (name, expiry), the secret shown once, list, revoke; audited."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.api.models import ApiToken
from taskhub.api.tokens import create_token, user_for_token
from taskhub.audit.models import AuditEvent
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_token_is_created_shown_once_and_works_for_the_api():
    olga = make_user("olga", OPERATORS)
    client = client_for(olga)
    # POST/redirect/GET: the POST creates and redirects; the page it redirects to shows the secret, once.
    response = client.post(reverse("tokens:list"), {"name": "CI pipeline", "expires": "30"})
    assert response.status_code == 302 and response["Location"] == reverse("tokens:list")
    response = client.get(reverse("tokens:list"))
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(user=olga)
    secret = response.context["created"]["secret"]
    assert secret in response.content.decode() and secret.startswith(token.prefix)
    assert secret not in str(dict(client.session))  # out of the session once shown
    assert token.name == "CI pipeline"
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)
    # The API knows it by its secret: with it, an API call is made as olga.
    api = Client(headers={"Authorization": f"Bearer {secret}"})
    assert api.get("/api/tasks").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None
    # Never shown again: the list has its prefix and when it was last used, not the secret.
    page = client.get(reverse("tokens:list")).content.decode()
    assert secret not in page and f"{token.prefix}…" in page and "CI pipeline" in page
    event = AuditEvent.objects.get(action="api_token.created")
    assert event.actor == olga and event.data["name"] == "CI pipeline" and "expires_at" in event.data
    assert secret not in str(event.data)


def test_a_token_made_to_expire_in_7_days_says_so():
    """Issue 34 item 8: it said "It expires in 6 days" (the page shown a moment after, every unit floored)."""
    client = client_for(make_user("olga", OPERATORS))
    client.post(reverse("tokens:list"), {"name": "a week", "expires": "7"})
    page = client.get(reverse("tokens:list")).content.decode()
    said = re.search(r"It expires <time[^>]*>([^<]*)</time>", page)
    assert said and said.group(1) == "in 1 week", said


def test_a_nameless_token_is_refused_and_nothing_is_created():
    client = client_for(make_user("amy", APPROVERS))
    response = client.post(reverse("tokens:list"), {"name": "  ", "expires": "30"})
    assert response.status_code == 400 and "This field is required." in response.content.decode()
    response = client.post(reverse("tokens:list"), {"name": "x", "expires": "forever"})
    assert response.status_code == 400
    assert not ApiToken.objects.exists() and not AuditEvent.objects.filter(action="api_token.created").exists()


def test_an_expired_token_is_refused():
    olga = make_user("olga", OPERATORS)
    _, secret = create_token(user=olga, name="old", expires_at=timezone.now() - timedelta(seconds=1))
    assert user_for_token(secret) is None
    assert Client(headers={"Authorization": f"Bearer {secret}"}).get("/api/tasks").status_code == 401
    page = client_for(olga).get(reverse("tokens:list")).content.decode()
    assert "expired" in page
    _, secret = create_token(user=olga, name="never", expires_at=None)
    assert user_for_token(secret) == olga


def test_people_revoke_their_own_tokens_and_admins_anyones():
    olga, amy, alex = make_user("olga", OPERATORS), make_user("amy", APPROVERS), make_user("alex", ADMINS)
    token, secret = create_token(user=olga, name="ops")
    # Someone else's token is not there for amy: not listed, not revocable.
    assert "ops" not in client_for(amy).get(reverse("tokens:list")).content.decode()
    assert client_for(amy).post(reverse("tokens:revoke", args=[token.pk])).status_code == 404
    assert user_for_token(secret) == olga
    # The admin sees everyone's, and revokes olga's.
    page = client_for(alex).get(reverse("tokens:list")).content.decode()
    assert "Everyone's tokens" in page and "olga" in page and "ops" in page
    # Revoking asks first: the confirmation page names the token and whose it is, and revokes nothing.
    page = client_for(alex).get(reverse("tokens:revoke", args=[token.pk])).content.decode()
    assert "Revoke “ops”?" in page and f"{token.prefix}…" in page and "olga" in page and "Keep it" in page
    assert user_for_token(secret) == olga
    response = client_for(alex).post(reverse("tokens:revoke", args=[token.pk]), follow=True)
    assert "Revoked the token" in response.content.decode()
    assert user_for_token(secret) is None
    event = AuditEvent.objects.get(action="api_token.revoked")
    assert event.actor == alex and event.data["for"] == "olga"
    # Olga revoking it again changes nothing and records nothing.
    response = client_for(olga).post(reverse("tokens:revoke", args=[token.pk]), follow=True)
    assert "was revoked already" in response.content.decode()
    assert AuditEvent.objects.filter(action="api_token.revoked").count() == 1
