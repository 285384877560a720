"""The admins' approval-policy page and `manage.py approval_policy`: thin over the services, refusals change nothing."""

import io
import json

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.approvals.models import ApprovalPolicy
from taskhub.audit.models import AuditEvent
from taskhub.servers.services import create_server
from tests.account_fixtures import make_user


@pytest.fixture
def server(db):
    return create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)


@pytest.fixture
def admin(db):
    client = Client()
    client.force_login(make_user("alex", ADMINS))
    return client


def test_an_admin_creates_edits_and_removes_a_policy(admin, server):
    olga = make_user("olga", APPROVERS)
    finance = Group.objects.create(name="finance")
    form = {
        "server": server.pk,
        "tool": "deploy",
        "groups": [finance.pk],
        "users": [olga.pk],
        "required_accepts": 2,
        "comment_required_on_decline": "on",
    }
    assert admin.post(reverse("approvals:add"), form).status_code == 302
    policy = ApprovalPolicy.objects.get()
    assert (policy.tool, policy.required_accepts, policy.allow_self_approval) == ("deploy", 2, False)
    assert policy.comment_required_on_decline and list(policy.users.all()) == [olga]

    listing = admin.get(reverse("approvals:list")).content.decode()
    assert "finance, olga" in listing and "<code>deploy</code>" in listing
    assert "deploy: finance, olga" in admin.get(reverse("servers:detail", args=[server.pk])).content.decode()

    again = admin.post(reverse("approvals:add"), form)
    assert again.status_code == 400 and "has a policy for the tool &#x27;deploy&#x27; already" in again.content.decode()
    zero = admin.post(reverse("approvals:edit", args=[policy.pk]), {**form, "required_accepts": 0})
    assert zero.status_code == 400 and ApprovalPolicy.objects.get().required_accepts == 2

    edited = admin.post(reverse("approvals:edit", args=[policy.pk]), {**form, "required_accepts": 3, "users": []})
    assert edited.status_code == 302
    policy.refresh_from_db()
    assert policy.required_accepts == 3 and not policy.users.exists()
    assert "people answer" in admin.get(reverse("approvals:list")).content.decode()
    to_agent = admin.post(reverse("approvals:edit", args=[policy.pk]), {**form, "input_from": "agent"})
    assert to_agent.status_code == 302 and ApprovalPolicy.objects.get().input_from == "agent"
    assert "the agent answers" in admin.get(reverse("approvals:list")).content.decode()

    assert admin.post(reverse("approvals:remove", args=[policy.pk])).status_code == 302
    assert not ApprovalPolicy.objects.exists()
    audited = AuditEvent.objects.filter(action__startswith="approval_policy").order_by("id")
    actions = list(audited.values_list("action", "actor_label"))
    assert actions == [
        ("approval_policy.created", "alex"),
        ("approval_policy.updated", "alex"),
        ("approval_policy.updated", "alex"),
        ("approval_policy.removed", "alex"),
    ]


def run(*args) -> str:
    out = io.StringIO()
    call_command("approval_policy", *args, stdout=out)
    return out.getvalue()


def test_the_command_sets_lists_and_removes_policies(server):
    make_user("olga", APPROVERS)
    Group.objects.create(name="finance")
    said = run("set", "demo", "--group", "finance", "--user", "olga", "--accepts", "2", "--self-approval", "refuse")
    assert "for finance, olga, 2 acceptance(s) needed" in said
    run("set", "demo", "--accepts", "3", "--comment-on-decline", "required")
    policy = ApprovalPolicy.objects.get()
    assert (policy.required_accepts, policy.comment_required_on_decline) == (3, True)
    assert [user.username for user in policy.users.all()] == ["olga"]  # not named again: kept
    assert "demo\t(every tool)\tfor finance, olga\t3 needed" in run("list")

    with pytest.raises(CommandError, match="No such group: nobody"):
        run("set", "demo", "--group", "nobody")
    with pytest.raises(CommandError, match="Not saved"):
        run("set", "demo", "--tool", "x", "--accepts", "0")
    with pytest.raises(CommandError, match="No server named 'gone'"):
        run("set", "gone")
    assert ApprovalPolicy.objects.count() == 1

    run("remove", "demo")
    assert not ApprovalPolicy.objects.exists()


def test_the_api_creates_lists_changes_and_deletes_policies(server):
    from taskhub.api.tokens import create_token

    token, secret = create_token(user=make_user("alex", ADMINS), name="t")
    client = Client(headers={"Authorization": f"Bearer {secret}"})
    make_user("olga", APPROVERS)

    def call(method, path, body=None):
        response = client.generic(method, f"/api/approval-policies{path}", json.dumps(body or {}), "application/json")
        return response.status_code, (response.json() if response.content else None)

    status, body = call("POST", "", {"server": "demo", "users": ["olga", "nobody"]})
    assert (status, body["error"]) == (400, "No such user: nobody.") and not ApprovalPolicy.objects.exists()
    status, created = call("POST", "", {"server": "demo", "users": ["olga"], "required_accepts": 2})
    assert status == 201 and created["answered_by"] == "olga" and created["allow_self_approval"] is False
    status, changed = call("PUT", f"/{created['id']}", {"server": "demo", "tool": "deploy", "required_accepts": 3})
    assert status == 200 and (changed["tool"], changed["users"], changed["answered_by"]) == (
        "deploy",
        [],
        "all approvers",
    )
    assert call("GET", "")[1] == [changed]
    assert call("DELETE", f"/{created['id']}")[0] == 204 and not ApprovalPolicy.objects.exists()
    # Done through a token: each audit row names it (the agent), its user stays the actor.
    audited = AuditEvent.objects.filter(action__startswith="approval_policy.").order_by("id")
    assert [(event.action, event.actor_label, event.data["agent"]["token_id"]) for event in audited] == [
        ("approval_policy.created", "alex", token.pk),
        ("approval_policy.updated", "alex", token.pk),
        ("approval_policy.removed", "alex", token.pk),
    ]


# --- a policy's webhooks ---------------------------------------------------------------------------------


def test_an_admin_adds_switches_and_removes_a_webhook_on_the_policy_page(admin, server):
    from taskhub.approvals.models import PolicyWebhook, WebhookDelivery

    policy = ApprovalPolicy.objects.create(server=server)
    page = reverse("approvals:edit", args=[policy.pk])
    assert "No webhook: nothing is sent" in admin.get(page).content.decode()

    add = reverse("approvals:webhook_add", args=[policy.pk])
    refused = admin.post(add, {"url": "http://169.254.169.254/latest", "secret": "hush-1", "format": "json"})
    assert refused.status_code == 400 and "Not an address for webhooks" in refused.content.decode()
    assert "hush-1" not in refused.content.decode() and not PolicyWebhook.objects.exists()
    no_secret = admin.post(add, {"url": "http://127.0.0.1:8080/hook", "format": "json", "enabled": "on"})
    assert no_secret.status_code == 400 and "needs a secret" in no_secret.content.decode()

    form = {"url": "http://127.0.0.1:8080/hook", "secret": "hush-2", "format": "json", "enabled": "on"}
    added = admin.post(add, form)
    assert added.status_code == 302 and added["Location"] == page
    webhook = PolicyWebhook.objects.get()
    assert (webhook.url, webhook.secret, webhook.enabled) == ("http://127.0.0.1:8080/hook", "hush-2", True)
    WebhookDelivery.objects.create(
        webhook=webhook,
        event="request.waiting",
        body={},
        status="failed",
        attempts=1,
        last_http_status=400,
        last_error="<script>alert(1)</script>",
    )
    html = admin.get(page).content.decode()
    assert "http://127.0.0.1:8080/hook" in html and "hush-2" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
    assert "gave up" in html and "HTTP 400" in html
    fragment = admin.get(page, headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith('<div id="webhook-deliveries"') and "gave up" in fragment

    assert admin.post(reverse("approvals:webhook_switch", args=[policy.pk, webhook.pk])).status_code == 302
    webhook.refresh_from_db()
    assert not webhook.enabled
    assert admin.post(reverse("approvals:webhook_remove", args=[policy.pk, webhook.pk])).status_code == 302
    assert not PolicyWebhook.objects.exists() and not WebhookDelivery.objects.exists()
    audited = AuditEvent.objects.filter(action__startswith="approval_webhook").order_by("id")
    actions = list(audited.values_list("action", flat=True))
    assert actions == ["approval_webhook.created", "approval_webhook.updated", "approval_webhook.removed"]
    assert "hush" not in json.dumps(list(AuditEvent.objects.values_list("data", flat=True)))


def test_the_command_adds_lists_switches_and_removes_webhooks(server, monkeypatch):
    from taskhub.approvals.models import PolicyWebhook

    with pytest.raises(CommandError, match="has no policy for every tool"):
        run("add-webhook", "demo", "--url", "http://127.0.0.1:8080/hook", "--secret", "x")
    run("set", "demo")
    with pytest.raises(CommandError, match="Not added: A JSON webhook needs a secret"):
        run("add-webhook", "demo", "--url", "http://127.0.0.1:8080/hook")
    monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin\n"))
    said = run("add-webhook", "demo", "--url", "http://127.0.0.1:8080/hook", "--secret-stdin")
    webhook = PolicyWebhook.objects.get()
    assert f"webhook {webhook.pk} added" in said and webhook.secret == "from-stdin"
    run("add-webhook", "demo", "--url", "https://hooks.example/services/T/B/x", "--format", "slack")
    listed = json.loads(run("webhooks", "--json"))
    assert [(row["format"], row["secret"]) for row in listed] == [("json", "set"), ("slack", "not set")]
    assert "from-stdin" not in run("webhooks")
    run("switch-webhook", str(webhook.pk), "off")
    webhook.refresh_from_db()
    assert not webhook.enabled
    run("remove-webhook", str(webhook.pk))
    assert PolicyWebhook.objects.count() == 1
    with pytest.raises(CommandError, match="No webhook"):
        run("remove-webhook", str(webhook.pk))


def test_the_api_manages_webhooks_and_never_shows_the_secret(server):
    from taskhub.api.tokens import create_token
    from taskhub.approvals.models import PolicyWebhook, WebhookDelivery

    _, token = create_token(user=make_user("alex", ADMINS), name="t")
    client = Client(headers={"Authorization": f"Bearer {token}"})
    policy = ApprovalPolicy.objects.create(server=server)
    base = f"/api/approval-policies/{policy.pk}"

    def call(method, path, body=None):
        response = client.generic(method, f"{base}{path}", json.dumps(body or {}), "application/json")
        return response.status_code, (response.json() if response.content else None)

    status, body = call("POST", "/webhooks", {"url": "ftp://127.0.0.1/x", "secret": "s"})
    assert (status, body["error"]) == (400, "A webhook URL starts with http:// or https://.")
    status, created = call("POST", "/webhooks", {"url": "http://127.0.0.1:8080/hook", "secret": "api-secret"})
    assert status == 201 and created["secret_set"] is True and "secret" not in created
    status, changed = call("PUT", f"/webhooks/{created['id']}", {"url": "http://127.0.0.1:8081/hook", "enabled": False})
    assert status == 200 and (changed["url"], changed["enabled"], changed["secret_set"]) == (
        "http://127.0.0.1:8081/hook",
        False,
        True,
    )
    assert PolicyWebhook.objects.get().secret == "api-secret"  # null kept it
    assert call("GET", "/webhooks") == (200, [changed])
    WebhookDelivery.objects.create(webhook_id=created["id"], event="request.waiting", body={}, attempts=2)
    status, deliveries = call("GET", "/webhook-deliveries")
    assert status == 200 and [(d["status"], d["attempts"]) for d in deliveries] == [("pending", 2)]
    assert "api-secret" not in json.dumps([call("GET", "/webhooks")[1], deliveries])
    assert call("DELETE", f"/webhooks/{created['id']}")[0] == 204 and not PolicyWebhook.objects.exists()
    assert call("DELETE", f"/webhooks/{created['id']}")[0] == 404
