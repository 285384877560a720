"""Step-up (issue 33 item 4): a connected server answers 403 `insufficient_scope` naming a scope it was not granted.
Nobody is asked in a worker: the server is marked as needing re-authorization with the wider scope kept, its page
says which scope, and the admin's next Connect asks the authorization server for it (with what the challenge and
metadata name); once granted, the server answers again and the mark is gone."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.urls import reverse

from taskhub.accounts.groups import ADMINS
from taskhub.servers.models import Server, ServerAuthorization
from tests.account_fixtures import make_user
from tests.oauth_server import protecting
from tests.test_oauth_connect import approve, start_connect
from tests.test_oauth_fresh_tokens import CLIENT_ID, LIFETIME, connected, discover

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def protected_demo(shared_demo_server):
    with protecting(shared_demo_server.url) as server:
        yield server


def test_a_403_insufficient_scope_asks_the_admin_to_connect_with_the_wider_scope(protected_demo):
    server, store, _ = connected(protected_demo, expires_in_s=LIFETIME)
    protected_demo.provider.clients[CLIENT_ID].scope = "admin"  # the authorization server would grant it
    assert "quick" in discover(server)

    protected_demo.required_scope = "admin"  # now the server wants more than the token carries
    with pytest.raises(Exception, match="connect it again"):
        discover(Server.objects.get(pk=server.pk))
    row = ServerAuthorization.objects.get(server=server)
    assert row.needs_reauthorization_since is not None and row.wanted_scope == "admin"
    assert protected_demo.provider.refresh_requests == 0  # a refresh would not widen the scope

    admin = Client()
    admin.force_login(make_user("alex", ADMINS))
    page = admin.get(reverse("servers:detail", args=[server.pk])).content.decode()
    assert "Needs re-authorization" in page and "wider scope" in page and ">admin</code>" in page

    authorization_url = start_connect(admin, Server.objects.get(pk=server.pk))
    asked = parse_qs(urlsplit(authorization_url).query)
    assert "admin" in asked["scope"][0].split()
    assert admin.get(reverse("servers:oauth_callback"), approve(authorization_url)).status_code == 302

    row.refresh_from_db()
    assert row.needs_reauthorization_since is None and row.wanted_scope == ""
    assert "admin" in (store.tokens_now().scope or "").split()
    assert "quick" in discover(Server.objects.get(pk=server.pk))
