"""The JSON API: each endpoint, its permissions, and bad input (a clear 4xx, nothing changed)."""

import datetime
import json

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from taskhub.accounts import permissions
from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.api.models import ApiToken
from taskhub.api.tokens import active_token, create_token, revoke_token
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from tests.account_fixtures import make_user
from tests.approval_fixtures import set_approver_groups
from tests.catalogue_fixtures import with_tools

pytestmark = pytest.mark.django_db

APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {"action": {"type": "string", "maxLength": 20}, "count": {"type": "integer", "minimum": 1}},
    "required": ["action"],
}
QUESTION = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Approve?",
        "requestedSchema": {
            "type": "object",
            "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 10}},
            "required": ["approved"],
        },
    },
}


@pytest.fixture
def server():
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:1/mcp", user=None)
    Server.objects.filter(pk=server.pk).update(tools=[{"name": "approval", "inputSchema": APPROVAL_SCHEMA}])
    server.refresh_from_db()
    return server


def api_client(user) -> Client:
    _, secret = create_token(user=user, name="tests")
    return Client(headers={"Authorization": f"Bearer {secret}"})


def post_json(client: Client, url: str, body) -> "tuple[int, dict]":
    response = client.post(url, data=json.dumps(body), content_type="application/json")
    return response.status_code, response.json()


def waiting_task(server, user) -> Task:
    task = services.launch(server=server, tool="approval", arguments={"action": "deploy"}, user=user)
    base = {"taskId": f"remote-{task.pk}", "createdAt": "2026-07-28T10:00:00Z", "ttlMs": 600000}
    task = services.record_launch_outcome(
        task=task, outcome=TaskCreated(task=TaskSnapshot.model_validate({**base, "status": "working"}))
    )
    services.apply_snapshot(
        task=task,
        snapshot=TaskSnapshot.model_validate({**base, "status": "input_required", "inputRequests": {"q": QUESTION}}),
    )
    task.refresh_from_db()
    return task


@pytest.fixture
def people():
    return {
        "operator": make_user("olga", OPERATORS),
        "approver": make_user("arun", APPROVERS),
        "admin": make_user("ada", ADMINS),
        "nobody": make_user("nina"),
    }


# --- authentication -------------------------------------------------------------------------------


def test_no_token_wrong_token_and_revoked_token_get_401(people):
    assert Client().get("/api/tasks").status_code == 401
    wrong = Client(headers={"Authorization": "Bearer thk_not-a-real-token"}).get("/api/tasks")
    assert wrong.status_code == 401 and "API token" in wrong.json()["error"]
    token, secret = create_token(user=people["operator"], name="ci")
    client = Client(headers={"Authorization": f"Bearer {secret}"})
    assert client.get("/api/tasks").status_code == 200
    revoke_token(token=token)
    assert client.get("/api/tasks").status_code == 401


def test_a_token_is_read_with_its_user_and_roles_in_one_statement_and_refused_once_unusable(
    people, django_assert_num_queries
):
    """active_token: one statement reads the token, its user and the user's roles (its role questions then ask
    nothing more); a revoked or expired token, or one of a deactivated user, is none."""
    token, secret = create_token(user=people["operator"], name="ci")
    active_token(secret)  # stamps its first use
    with django_assert_num_queries(1):
        read = active_token(secret)
        assert read == token and read.user == people["operator"]
        assert permissions.roles_of(read.user) == permissions.Roles(operator=True)
    _, approver_secret = create_token(user=people["approver"], name="approver")
    assert permissions.roles_of(active_token(approver_secret).user) == permissions.Roles(approver=True)

    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - datetime.timedelta(seconds=1))
    assert active_token(secret) is None
    User.objects.filter(pk=people["approver"].pk).update(is_active=False)
    assert active_token(approver_secret) is None
    _, admin_secret = create_token(user=people["admin"], name="admin")
    revoke_token(token=ApiToken.objects.get(name="admin"))
    assert active_token(admin_secret) is None
    assert active_token(admin_secret[:-1]) is None and active_token("") is None


def test_tokens_are_stored_hashed_and_their_creation_audited(people):
    token, secret = create_token(user=people["operator"], name="ci")
    assert secret.startswith("thk_") and secret not in token.key_hash
    assert not ApiToken.objects.filter(key_hash=secret).exists()
    event = AuditEvent.objects.get(action="api_token.created")
    assert event.data["prefix"] == token.prefix and secret not in json.dumps(event.data)


def test_the_api_documentation_is_for_signed_in_users_and_token_holders_only(people):
    for path in ("/api/docs", "/api/openapi.json"):
        anonymous = Client().get(path)
        assert anonymous.status_code == 302 and anonymous["Location"] == f"/accounts/login/?next={path}", path
        forged = Client(headers={"Authorization": "Bearer thk_not-a-real-token"}).get(path)
        assert forged.status_code == 302, path
        signed_in = Client()
        signed_in.force_login(people["nobody"])  # any role, or none
        assert signed_in.get(path).status_code == 200, path
        assert api_client(people["nobody"]).get(path).status_code == 200, path
    token, secret = create_token(user=people["operator"], name="revoked")
    revoke_token(token=token)
    assert Client(headers={"Authorization": f"Bearer {secret}"}).get("/api/openapi.json").status_code == 302


def test_the_openapi_document_lists_every_endpoint(people):
    document = api_client(people["nobody"]).get("/api/openapi.json").json()
    paths = set(document["paths"])
    assert {"/api/tasks", "/api/tasks/{task_id}", "/api/tasks/{task_id}/cancel", "/api/inbox"} <= paths
    assert "/api/input-requests/{request_id}/answer" in paths
    assert "bearer" in json.dumps(document["components"]["securitySchemes"]).lower()
    # Each filter of the task list says what it takes; `q` that it searches every field.
    parameters = {p["name"]: p for p in document["paths"]["/api/tasks"]["get"]["parameters"]}
    assert all(parameter.get("description") for parameter in parameters.values()), parameters
    search = parameters["q"]["description"]
    for field in ("status message", "tool", "server's task id", "arguments", "result", "our task id"):
        assert field in search, field


# --- launch ---------------------------------------------------------------------------------------


def test_an_operator_launches_and_the_audit_names_the_tokens_user(server, people):
    status, body = post_json(
        api_client(people["operator"]),
        "/api/tasks",
        {"server": "demo", "tool": "approval", "arguments": {"action": "go"}},
    )
    assert status == 201, body
    task = Task.objects.get(pk=body["id"])
    assert task.arguments == {"action": "go"} and body["status"] == "launching"
    assert AuditEvent.objects.get(task=task, action="task.launched").actor_label == "olga"


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"server": "nope", "tool": "approval"}, 404, "No server"),
        ({"server": "demo", "tool": "nope"}, 404, "no tool"),
        ({"server": "demo", "tool": "approval", "arguments": {"count": 0}}, 400, "input schema"),
        ({"server": "demo", "tool": "approval", "arguments": "not an object"}, 400, "expected shape"),
        ({"tool": "approval"}, 400, "expected shape"),
    ],
)
def test_bad_launches_are_refused_clearly_and_create_nothing(server, people, body, status, words):
    got_status, got = post_json(api_client(people["operator"]), "/api/tasks", body)
    assert got_status == status, got
    assert words in got["error"]
    assert not Task.objects.exists()


def test_schema_errors_name_the_fields(server, people):
    status, body = post_json(
        api_client(people["operator"]), "/api/tasks", {"server": "demo", "tool": "approval", "arguments": {"count": 0}}
    )
    assert status == 400 and set(body["fields"]) >= {"action", "count"}


def test_malformed_json_is_a_400(server, people):
    response = api_client(people["operator"]).post("/api/tasks", data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]
    assert not Task.objects.exists()


def test_only_operators_launch(server, people):
    for who in ("approver", "nobody"):
        status, _ = post_json(api_client(people[who]), "/api/tasks", {"server": "demo", "tool": "approval"})
        assert status == 403
    assert not Task.objects.exists()


# --- list and get -----------------------------------------------------------------------------------


def test_list_filters_like_the_page_and_pages(server, people):
    for n in range(3):
        services.launch(server=server, tool="approval", arguments={"action": str(n)}, user=people["operator"])
    services.launch(server=with_tools(server, "other"), tool="other", arguments={}, user=people["admin"])
    client = api_client(people["operator"])
    assert client.get("/api/tasks").json()["count"] == 4
    assert client.get("/api/tasks", {"launched_by": "ada"}).json()["count"] == 1
    assert client.get("/api/tasks", {"tool": "approval", "server": "demo"}).json()["count"] == 3
    assert client.get("/api/tasks", {"status": "other"}).json()["count"] == 4  # launching is a local state
    paged = client.get("/api/tasks", {"page_size": 3, "page": 2}).json()
    assert paged["pages"] == 2 and len(paged["results"]) == 1
    bad = client.get("/api/tasks", {"status": "sleeping"})
    assert bad.status_code == 400 and "status" in bad.json()["fields"]
    # the page's newer filters too: a part of a tool's name, the arguments, "my tasks", an outcome
    assert client.get("/api/tasks", {"tool": "approv"}).json()["count"] == 3
    assert client.get("/api/tasks", {"q": '"action": "2"'}).json()["count"] == 1
    assert client.get("/api/tasks", {"mine": "true"}).json()["count"] == 3
    assert client.get("/api/tasks", {"outcome": "completed"}).json()["count"] == 0
    bad = client.get("/api/tasks", {"outcome": "splendid", "since": "soon"})
    assert bad.status_code == 400 and {"outcome", "since"} <= set(bad.json()["fields"])
    assert api_client(people["nobody"]).get("/api/tasks").status_code == 403


def test_an_approver_sees_only_the_tasks_of_servers_they_approve(server, people):
    task = waiting_task(server, people["operator"])
    other = create_server(name="other", transport="http", url="http://127.0.0.1:2/mcp", user=None)
    set_approver_groups(other, [Group.objects.create(name="others")])
    hidden = services.launch(server=with_tools(other, "x"), tool="x", arguments={}, user=people["operator"])
    client = api_client(people["approver"])
    assert [row["id"] for row in client.get("/api/tasks").json()["results"]] == [str(task.pk)]
    assert client.get(f"/api/tasks/{hidden.pk}").status_code == 404
    detail = client.get(f"/api/tasks/{task.pk}").json()
    assert detail["input_requests"][0]["key"] == "q" and detail["input_requests"][0]["state"] == "open"


# --- answer -----------------------------------------------------------------------------------------


def test_an_approver_answers_once_and_the_second_answer_is_a_409(server, people):
    task = waiting_task(server, people["operator"])
    request = InputRequest.objects.get(task=task)
    url = f"/api/input-requests/{request.pk}/answer"
    assert [row["id"] for row in api_client(people["approver"]).get("/api/inbox").json()["results"]] == [request.pk]
    status, body = post_json(api_client(people["approver"]), url, {"action": "accept", "content": {"approved": True}})
    assert status == 200 and body["state"] == "answered" and body["answered_by"] == "arun"
    second = make_user("amir", APPROVERS)
    status, body = post_json(api_client(second), url, {"action": "decline"})
    assert status == 409 and "already answered by arun" in body["error"]
    request.refresh_from_db()
    assert request.answer == {"action": "accept", "content": {"approved": True}}
    assert AuditEvent.objects.get(action="input.answered").actor_label == "arun"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "accept", "content": {"approved": "yes"}}, "approved"),
        ({"action": "accept", "content": {"reason": "fine"}}, "approved"),
        ({"action": "accept", "content": {"approved": True, "reason": "x" * 11}}, "reason"),
    ],
)
def test_answers_that_do_not_fit_the_schema_are_400_and_record_nothing(server, people, body, field):
    request = InputRequest.objects.get(task=waiting_task(server, people["operator"]))
    status, got = post_json(api_client(people["approver"]), f"/api/input-requests/{request.pk}/answer", body)
    assert status == 400 and field in got["fields"], got
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN


def test_answer_permissions_and_unknown_requests(server, people):
    request = InputRequest.objects.get(task=waiting_task(server, people["operator"]))
    url = f"/api/input-requests/{request.pk}/answer"
    status, _ = post_json(api_client(people["operator"]), url, {"action": "decline"})
    assert status == 403  # sees the task, does not approve
    set_approver_groups(server, [Group.objects.create(name="reviewers")])
    status, _ = post_json(api_client(people["approver"]), url, {"action": "decline"})
    assert status == 404  # an approver of other servers does not see it at all
    status, body = post_json(api_client(people["operator"]), "/api/input-requests/999999/answer", {"action": "decline"})
    assert status == 404
    status, body = post_json(api_client(make_user("rita", "reviewers")), url, {"action": "maybe"})
    assert status == 400 and "action" in body["fields"]
    request.refresh_from_db()
    assert request.state == InputRequestState.OPEN


# --- cancel -----------------------------------------------------------------------------------------


def test_cancel_then_cancel_a_finished_task(server, people):
    task = waiting_task(server, people["operator"])
    client = api_client(people["operator"])
    assert api_client(people["approver"]).post(f"/api/tasks/{task.pk}/cancel").status_code == 403
    response = client.post(f"/api/tasks/{task.pk}/cancel")
    assert response.status_code == 202 and response.json()["cancel_requested_at"]
    assert AuditEvent.objects.get(action="task.cancel_requested").actor_label == "olga"
    base = {"taskId": task.remote_task_id, "createdAt": "2026-07-28T10:00:00Z", "ttlMs": 600000}
    services.apply_snapshot(task=task, snapshot=TaskSnapshot.model_validate({**base, "status": "completed"}))
    finished = client.post(f"/api/tasks/{task.pk}/cancel")
    assert finished.status_code == 409 and "already" in finished.json()["error"]
