"""The API and the gateway answer unstorable text, oversized bodies and wrong methods with a JSON 400/413/405, never a
500 or an HTML page (issue 31, point 5: a lone surrogate in a server's name, a policy's tool or a webhook's URL was a
UnicodeEncodeError, a NUL in a gateway tool name a DataError, a 6 MB body RequestDataTooBig, a 405 HTML)."""

import json

import pytest
from django.test import Client
from django.utils import timezone

from taskhub.accounts.groups import ADMINS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.approvals import services as policy_services
from taskhub.audit.models import AuditEvent
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks.models import Task
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db

DEPLOY = {"name": "deploy", "inputSchema": {"type": "object", "properties": {"target": {"type": "string"}}}}
LONE_SURROGATE = "\ud800"
NUL = "\x00"


@pytest.fixture
def world():
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    Server.objects.filter(pk=alpha.pk).update(tools=[DEPLOY], discovered_at=timezone.now())
    _, admin_secret = create_token(user=make_user("ada", ADMINS), name="admin")
    _, agent_secret = create_token(user=make_user("agent", OPERATORS), name="agent")
    policy = policy_services.create_policy(server=alpha, tool="deploy", user=None)
    return {"policy": policy, "admin": admin_secret, "agent": agent_secret}


def send(method: str, path: str, token: str, body=None, *, raw: bytes | None = None):
    client = Client(headers={"Authorization": f"Bearer {token}"})
    data = raw if raw is not None else (json.dumps(body) if body is not None else "")
    return client.generic(method, path, data, content_type="application/json")


def remembered() -> tuple[int, int]:
    return Task.objects.count(), AuditEvent.objects.count()


@pytest.mark.parametrize("bad", [LONE_SURROGATE, NUL, f"alpha{NUL}"])
@pytest.mark.parametrize(
    ("path", "body", "fields"),
    [
        ("/api/tasks", lambda bad: {"server": bad, "tool": "deploy", "arguments": {}}, {"server"}),
        (
            "/api/tasks",
            lambda bad: {"server": "alpha", "tool": "deploy", "arguments": {"target": bad}},
            {"target"},  # a tool's argument by its own name, as the API's other errors name it
        ),
        ("/api/approval-policies", lambda bad: {"server": "alpha", "tool": bad}, {"tool"}),
        (
            "/api/approval-policies/{policy}/webhooks",
            lambda bad: {"url": f"https://hooks.example/{bad}", "secret": bad},
            {"url", "secret"},
        ),
    ],
)
def test_unstorable_text_in_the_api_is_a_json_400_and_changes_nothing(world, bad, path, body, fields):
    before = remembered()
    response = send("POST", path.format(policy=world["policy"].pk), world["admin"], body(bad))
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/json"
    assert "cannot be stored" in response.json()["error"]
    assert set(response.json()["fields"]) == fields
    assert remembered() == before


@pytest.mark.parametrize("bad", [LONE_SURROGATE, NUL])
def test_unstorable_text_through_the_gateway_is_a_json_rpc_error_with_the_requests_id(world, bad):
    before = remembered()
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": f"deploy{bad}", "arguments": {}}}
    response = send("POST", "/mcp/servers/alpha", world["agent"], body)
    assert response.status_code == 400
    assert response.json()["id"] == 7 and response.json()["error"]["code"] == -32602
    assert remembered() == before


@pytest.mark.parametrize("path", ["/mcp/servers/%00", "/api/tasks/%00"])
def test_a_nul_in_the_address_is_a_json_400(world, path):
    response = send("GET", path, world["agent"])
    assert response.status_code == 400 and response["Content-Type"] == "application/json"


@pytest.mark.parametrize(("path", "size"), [("/mcp/servers/alpha", 6_000_000), ("/api/tasks", 3_000_000)])
def test_a_body_over_the_limit_is_a_json_413(world, path, size):
    padding = "x" * size
    raw = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "server": "alpha", "pad": padding}).encode()
    response = send("POST", path, world["agent"], raw=raw)
    assert response.status_code == 413 and response["Content-Type"] == "application/json"


def test_a_method_the_api_does_not_take_is_a_json_405_with_allow(world):
    response = send("PUT", "/api/tasks", world["agent"], {})
    assert response.status_code == 405
    assert response["Content-Type"] == "application/json" and "PUT" in response.json()["error"]
    assert "POST" in response["Allow"]
