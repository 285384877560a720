"""The home page and /healthz through Django's test client, on the real database."""

import pytest
from django.conf import settings
from django.contrib.auth.models import Group

pytestmark = pytest.mark.django_db


def test_home_page_says_what_taskhub_is(client, django_user_model):
    # an admin who also approves sees every nav item; each role sees only its own (tests/test_accounts.py)
    admin = django_user_model.objects.create_superuser(username="root", password=None)
    admin.groups.add(Group.objects.get_or_create(name="approvers")[0])
    client.force_login(admin)
    response = client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    # signed in: the dashboard (tests/test_dashboard.py); anonymous: what taskhub is
    assert 'id="dashboard"' in page and "The control room for long-running MCP tool calls" not in page
    client.logout()
    assert "The control room for long-running MCP tool calls" in client.get("/").content.decode()
    for nav_item in ("Tasks", "Inbox", "Launch", "Servers", "Audit"):
        assert nav_item in page
    assert 'id="live-indicator"' in page
    assert "htmx-2.min.js" in page
    assert "/static/taskhub/taskhub.css" in page
    assert 'id="system-status"' in page
    assert "reachable" in page


def test_htmx_request_gets_only_the_status_fragment(client):
    response = client.get("/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section class="system-status"')
    assert "<html" not in fragment


def test_signed_in_user_is_named_in_the_top_bar(client, django_user_model):
    user = django_user_model.objects.create_user(username="dana", password="correct horse battery")
    client.force_login(user)
    page = client.get("/").content.decode()
    assert "dana" in page
    assert "Sign out" in page


def test_healthz_reports_the_database(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"]
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"]["ok"] is True
    assert body["database"]["vendor"] == "postgresql"
    assert body["database"]["embedded"] is (settings.DATABASES["default"]["ENGINE"] == "taskhub.embedded_pg")


def test_healthz_refuses_post(client):
    assert client.post("/healthz").status_code == 405


def _postgres_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return cursor.fetchone()[0]


def test_the_database_version_is_shown_to_signed_in_admins_only(client, django_user_model):
    version = _postgres_version()
    operator = django_user_model.objects.create_user(username="olga")
    operator.groups.add(Group.objects.get_or_create(name="operators")[0])
    admin = django_user_model.objects.create_superuser(username="root", password=None)
    for who in (None, operator):
        if who is not None:
            client.force_login(who)
        health = client.get("/healthz").json()
        assert health["status"] == "ok"
        assert "version" not in health["database"]
        assert version not in client.get("/healthz").content.decode()
        assert version not in client.get("/", headers={"HX-Request": "true"}).content.decode()
    client.force_login(admin)
    assert client.get("/healthz").json()["database"]["version"] == version
    assert f"PostgreSQL {version}" in client.get("/", headers={"HX-Request": "true"}).content.decode()
