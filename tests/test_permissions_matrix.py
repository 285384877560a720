"""Every route, every role, with the status code each must get (issue 7's permissions matrix).

The table lists every URL route of taskhub's apps and API (Django's admin site guards itself: one row checks it
sends everyone but staff to its own sign-in). A route that appears without a row fails the test, so no page can
be added unguarded. Roles:

- anonymous: not signed in (pages send to sign-in, 302; the API answers 401);
- approver: approves for the server `alpha` (in `approvers` and alpha's approver group);
- other_approver: an approver, but of `beta` only: alpha's task and its requests are hidden from them (404, as
  if they did not exist), on the pages and in the API alike;
- operator: launches and cancels, is no approver (the inbox is 403);
- admin: in `admins` (an operator too), not an approver;
- agent: in `agents` only: launches through the API (its own tasks: tests/test_agents.py), sees no task on the
  pages and not the operator's task in the API (404), and no operator or approver page (403).

The subject of every row is one task on `alpha`, waiting on one input request, launched by the operator.
Allowed POSTs send an empty or minimal body: 400 there means "let through the guard, then the form said no".
The live socket (the consumer) is checked at the end.
"""

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from taskhub.accounts.groups import ADMINS, AGENTS, APPROVERS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.approvals.models import PolicyWebhook
from taskhub.live.consumer import CLOSE_NOT_SIGNED_IN
from taskhub.mcp.client import TaskCreated
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest
from tests.account_fixtures import make_user
from tests.approval_fixtures import set_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot

ROLES = ("anonymous", "approver", "other_approver", "operator", "admin", "agent")
LOGIN = 302  # a page's answer to anonymous: the sign-in page, with ?next=
# fmt: off
MATRIX = {
    # (method, route):                        anonymous approver other_approver operator admin agent
    ("GET", "web:home"):                      (200,   200, 200, 200, 200, 200),
    ("GET", "web:healthz"):                   (200,   200, 200, 200, 200, 200),
    ("GET", "web:favicon"):                   (301,   301, 301, 301, 301, 301),
    ("GET", "accounts:login"):                (200,   302, 302, 302, 302, 302),
    ("POST", "accounts:logout"):              (302,   302, 302, 302, 302, 302),
    ("POST", "accounts:language"):            (LOGIN, 302, 302, 302, 302, 302),  # empty POST: the browser's language
    ("GET", "accounts:sso"):                  (404,   404, 404, 404, 404, 404),  # no provider configured here
    ("GET", "accounts:sso_callback"):         (404,   404, 404, 404, 404, 404),  # (tests/test_sso.py: with one)
    ("GET", "tasks:list"):                    (LOGIN, 200, 200, 200, 200, 403),
    ("GET", "tasks:detail"):                  (LOGIN, 200, 404, 200, 200, 404),
    ("POST", "tasks:cancel"):                 (LOGIN, 403, 404, 302, 302, 404),
    ("GET", "tasks:cancel_confirm"):          (LOGIN, 403, 404, 200, 200, 404),  # the confirm step
    ("GET", "tasks:cancel_many"):             (LOGIN, 403, 403, 200, 200, 403),  # the dry run
    ("POST", "tasks:cancel_many"):            (LOGIN, 403, 403, 400, 400, 403),  # no dry run's time: nothing done
    ("GET", "tasks:launch"):                  (LOGIN, 403, 403, 200, 200, 403),
    ("GET", "tasks:launch_tool"):             (LOGIN, 403, 403, 200, 200, 403),
    ("POST", "tasks:launch_tool"):            (LOGIN, 403, 403, 400, 400, 403),
    ("GET", "tasks:inbox"):                   (LOGIN, 200, 200, 403, 403, 403),
    ("POST", "tasks:answer"):                 (LOGIN, 302, 404, 403, 403, 403),
    ("POST", "tasks:answer_like"):            (LOGIN, 302, 302, 403, 403, 403),  # nothing ticked: back, unanswered
    ("GET", "servers:list"):                  (LOGIN, 403, 403, 403, 200, 403),
    ("GET", "servers:add"):                   (LOGIN, 403, 403, 403, 200, 403),
    ("POST", "servers:add"):                  (LOGIN, 403, 403, 403, 200, 403),  # empty POST: the blank form again
    ("GET", "servers:detail"):                (LOGIN, 403, 403, 403, 200, 403),
    ("GET", "servers:edit"):                  (LOGIN, 403, 403, 403, 200, 403),
    ("POST", "servers:edit"):                 (LOGIN, 403, 403, 403, 200, 403),  # empty POST: the form again
    ("POST", "servers:discover"):             (LOGIN, 403, 403, 403, 302, 403),
    ("GET", "servers:discovery"):             (LOGIN, 403, 403, 403, 200, 403),
    ("GET", "servers:process"):               (LOGIN, 403, 403, 403, 404, 403),  # an HTTP server: no process
    ("GET", "servers:remove"):                (LOGIN, 403, 403, 403, 200, 403),  # the confirmation page
    ("POST", "servers:remove"):               (LOGIN, 403, 403, 403, 400, 403),  # unconfirmed: nothing removed
    ("POST", "servers:connect"):              (LOGIN, 403, 403, 403, 302, 403),  # alpha does not answer: back, why
    ("GET", "servers:oauth_client"):          (LOGIN, 403, 403, 403, 200, 403),
    ("POST", "servers:oauth_client"):         (LOGIN, 403, 403, 403, 400, 403),  # empty POST: no client id
    ("GET", "servers:oauth_callback"):        (LOGIN, 403, 403, 403, 400, 403),  # no Connect's state: refused
    ("GET", "servers:oauth_client_metadata"): (404,   404, 404, 404, 404, 404),  # public, with an https address
    ("GET", "approvals:list"):                (LOGIN, 403, 403, 403, 200, 403),
    ("GET", "approvals:add"):                 (LOGIN, 403, 403, 403, 200, 403),
    ("POST", "approvals:add"):                (LOGIN, 403, 403, 403, 400, 403),  # empty POST: the form again
    ("GET", "approvals:edit"):                (LOGIN, 403, 403, 403, 200, 403),
    ("POST", "approvals:edit"):               (LOGIN, 403, 403, 403, 400, 403),  # empty POST: the form again
    ("POST", "approvals:remove"):             (LOGIN, 403, 403, 403, 302, 403),
    ("POST", "approvals:webhook_add"):        (LOGIN, 403, 403, 403, 400, 403),  # empty POST: the form again
    ("POST", "approvals:webhook_switch"):     (LOGIN, 403, 403, 403, 302, 403),
    ("POST", "approvals:webhook_remove"):     (LOGIN, 403, 403, 403, 302, 403),
    ("GET", "api:list_policies"):             (401,   403, 403, 403, 200, 403),
    ("POST", "api:create_policy"):            (401,   403, 403, 403, 201, 403),
    ("PUT", "api:update_policy"):             (401,   403, 403, 403, 200, 403),
    ("DELETE", "api:delete_policy"):          (401,   403, 403, 403, 204, 403),
    ("GET", "api:list_webhooks"):             (401,   403, 403, 403, 200, 403),
    ("POST", "api:create_webhook"):           (401,   403, 403, 403, 201, 403),
    ("PUT", "api:update_webhook"):            (401,   403, 403, 403, 200, 403),
    ("DELETE", "api:delete_webhook"):         (401,   403, 403, 403, 204, 403),
    ("GET", "api:list_webhook_deliveries"):   (401,   403, 403, 403, 200, 403),
    # API tokens: everyone their own (the subject is the operator's token), admins everyone's.
    ("GET", "tokens:list"):                   (LOGIN, 200, 200, 200, 200, 200),
    ("POST", "tokens:list"):                  (LOGIN, 400, 400, 400, 400, 400),  # empty POST: the form says no
    ("GET", "notifications:preferences"):     (LOGIN, 200, 200, 200, 200, 200),
    ("POST", "notifications:preferences"):    (LOGIN, 302, 302, 302, 302, 302),  # empty POST: every box unticked
    ("GET", "tokens:revoke"):                 (LOGIN, 404, 404, 200, 200, 404),  # the confirmation page
    ("POST", "tokens:revoke"):                (LOGIN, 404, 404, 302, 302, 404),
    ("GET", "audit:list"):                    (LOGIN, 403, 403, 403, 200, 403),
    # People (the subject is the operator): admins only.
    ("GET", "people:list"):                   (LOGIN, 403, 403, 403, 200, 403),
    ("POST", "people:list"):                  (LOGIN, 403, 403, 403, 400, 403),  # empty POST: the form says no
    ("GET", "people:detail"):                 (LOGIN, 403, 403, 403, 200, 403),
    ("POST", "people:detail"):                (LOGIN, 403, 403, 403, 302, 403),  # empty POST: no groups
    ("POST", "people:state"):                 (LOGIN, 403, 403, 403, 302, 403),  # neither: nothing changed
    ("POST", "people:password"):              (LOGIN, 403, 403, 403, 302, 403),  # unconfirmed: nothing changed
    ("GET", "audit:export"):                  (LOGIN, 403, 403, 403, 200, 403),
    ("GET", "audit:verify"):                  (LOGIN, 403, 403, 403, 200, 403),
    # The API: a bearer token of the role's user; anonymous sends none.
    ("GET", "api:api-root"):                  (404,   404, 404, 404, 404, 404),
    ("GET", "api:openapi-json"):              (LOGIN, 200, 200, 200, 200, 200),  # a token or a session (any role)
    ("GET", "api:openapi-view"):              (LOGIN, 200, 200, 200, 200, 200),
    ("GET", "api:list_tasks"):                (401,   200, 200, 200, 200, 200),
    ("POST", "api:launch_task"):              (401,   403, 403, 400, 400, 400),
    ("GET", "api:get_task"):                  (401,   200, 404, 200, 200, 404),
    ("POST", "api:cancel_task"):              (401,   403, 404, 202, 202, 404),
    ("GET", "api:inbox"):                     (401,   200, 200, 403, 403, 403),
    ("POST", "api:answer"):                   (401,   200, 404, 403, 403, 404),
    # The MCP gateway: an API token of anyone; an empty POST is no JSON-RPC request (400), what each may call is
    # tests/test_gateway.py's.
    ("POST", "gateway:aggregate"):            (401,   400, 400, 400, 400, 400),
    ("POST", "gateway:server"):               (401,   400, 400, 400, 400, 400),
    # Django's admin site: staff only (none of these roles is staff), its own sign-in page.
    ("GET", "admin:index"):                   (302,   302, 302, 302, 302, 302),
    # Prometheus metrics: for a scraper's token or address, not for a role (none set here: refused to all).
    ("GET", "observability:metrics"):         (403,   403, 403, 403, 403, 403),
}
# fmt: on
NOT_IN_MATRIX = {"admin"}  # the admin site's own routes: one row above stands for them

APPROVAL = {"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": {"type": "object"}}}
TOOL = {"name": "deploy", "inputSchema": {"type": "object", "properties": {"target": {"type": "string"}},
                                          "required": ["target"]}}  # fmt: skip


def route_names() -> set[str]:
    names = set()

    def walk(patterns, namespace: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                inner = f"{namespace}:{pattern.namespace}" if namespace and pattern.namespace else pattern.namespace
                if (inner or namespace) in NOT_IN_MATRIX:
                    continue
                walk(pattern.url_patterns, inner or namespace)
            elif isinstance(pattern, URLPattern):
                assert pattern.name, f"unnamed route {pattern.pattern}: name it and add it to MATRIX"
                names.add(f"{namespace}:{pattern.name}" if namespace else pattern.name)

    walk(get_resolver().url_patterns, "")
    return names


def test_the_matrix_lists_every_route():
    listed = {route for _, route in MATRIX}
    missing = route_names() - listed - {"admin:index"}
    assert not missing, f"routes without a row in MATRIX (add the expected status per role): {sorted(missing)}"
    gone = listed - route_names() - {"admin:index"}
    assert not gone, f"MATRIX rows for routes that no longer exist: {sorted(gone)}"


@pytest.fixture
def world(db):
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    beta = create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=None)
    policy = set_approver_groups(alpha, [Group.objects.create(name="alpha-approvers")])
    set_approver_groups(beta, [Group.objects.create(name="beta-approvers")])
    Server.objects.filter(pk=alpha.pk).update(tools=[TOOL], discovered_at=timezone.now())
    users = {
        "approver": make_user("amy", APPROVERS, "alpha-approvers"),
        "other_approver": make_user("ben", APPROVERS, "beta-approvers"),
        "operator": make_user("olga", OPERATORS),
        "admin": make_user("alex", ADMINS),
        "agent": make_user("ada", AGENTS),
    }
    task = services.launch(server=alpha, tool="deploy", arguments={"target": "x"}, user=users["operator"])
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot("working")))
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", inputRequests={"go": APPROVAL}))
    input_request = InputRequest.objects.get(task=task, key="go")
    token, _ = create_token(user=users["operator"], name="ops")
    webhook = PolicyWebhook.objects.create(policy=policy, url="http://127.0.0.1:9/hook", secret="matrix")
    return {
        "server": alpha,
        "users": users,
        "task": task,
        "request": input_request,
        "token": token,
        "policy": policy,
        "webhook": webhook,
    }


def request_for(method: str, route: str, world) -> tuple[str, dict]:
    """The URL of the route for the world's subjects, and the body a POST sends."""
    s, t, r = world["server"].pk, world["task"].pk, world["request"].pk
    urls = {
        "web:home": "/",
        "web:healthz": "/healthz",
        "web:favicon": "/favicon.ico",
        "accounts:login": "/accounts/login/",
        "accounts:logout": "/accounts/logout/",
        "accounts:language": "/accounts/language/",
        "tasks:list": "/tasks/",
        "tasks:detail": f"/tasks/{t}/",
        "tasks:cancel": f"/tasks/{t}/cancel",
        "tasks:cancel_confirm": f"/tasks/{t}/confirm-cancel",
        "tasks:cancel_many": "/tasks/cancel-many",
        "tasks:launch": "/launch/",
        "tasks:launch_tool": f"/launch/{s}/deploy/",
        "tasks:inbox": "/inbox/",
        "tasks:answer": f"/inbox/{r}/answer",
        "tasks:answer_like": "/inbox/answer-like",
        "servers:list": "/servers/",
        "servers:add": "/servers/add/",
        "servers:detail": f"/servers/{s}/",
        "servers:edit": f"/servers/{s}/edit/",
        "servers:discover": f"/servers/{s}/discover",
        "servers:discovery": f"/servers/{s}/discovery/",
        "servers:process": f"/servers/{s}/process/",
        "servers:remove": f"/servers/{s}/remove/",
        "servers:connect": f"/servers/{s}/connect",
        "servers:oauth_client": f"/servers/{s}/connect/client/",
        "servers:oauth_callback": "/servers/oauth/callback",
        "servers:oauth_client_metadata": "/servers/oauth/client-metadata.json",
        "approvals:list": "/approvals/",
        "approvals:add": "/approvals/add/",
        "approvals:edit": f"/approvals/{world['policy'].pk}/edit/",
        "approvals:remove": f"/approvals/{world['policy'].pk}/remove",
        "approvals:webhook_add": f"/approvals/{world['policy'].pk}/webhooks/add",
        "approvals:webhook_switch": f"/approvals/{world['policy'].pk}/webhooks/{world['webhook'].pk}/switch",
        "approvals:webhook_remove": f"/approvals/{world['policy'].pk}/webhooks/{world['webhook'].pk}/remove",
        "tokens:list": "/tokens/",
        "notifications:preferences": "/account/notifications/",
        "tokens:revoke": f"/tokens/{world['token'].pk}/revoke",
        "audit:list": "/audit/",
        "people:list": "/people/",
        "people:detail": f"/people/{world['users']['operator'].pk}/",
        "people:state": f"/people/{world['users']['operator'].pk}/state",
        "people:password": f"/people/{world['users']['operator'].pk}/password",
        "audit:export": "/audit/export.csv",
        "audit:verify": "/audit/verify",
        "api:api-root": "/api/",
        "api:openapi-json": "/api/openapi.json",
        "api:openapi-view": "/api/docs",
        "api:list_tasks": "/api/tasks",
        "api:launch_task": "/api/tasks",
        "api:get_task": f"/api/tasks/{t}",
        "api:cancel_task": f"/api/tasks/{t}/cancel",
        "api:inbox": "/api/inbox",
        "api:answer": f"/api/input-requests/{r}/answer",
        "api:list_policies": "/api/approval-policies",
        "api:create_policy": "/api/approval-policies",
        "api:update_policy": f"/api/approval-policies/{world['policy'].pk}",
        "api:delete_policy": f"/api/approval-policies/{world['policy'].pk}",
        "api:list_webhooks": f"/api/approval-policies/{world['policy'].pk}/webhooks",
        "api:create_webhook": f"/api/approval-policies/{world['policy'].pk}/webhooks",
        "api:update_webhook": f"/api/approval-policies/{world['policy'].pk}/webhooks/{world['webhook'].pk}",
        "api:delete_webhook": f"/api/approval-policies/{world['policy'].pk}/webhooks/{world['webhook'].pk}",
        "api:list_webhook_deliveries": f"/api/approval-policies/{world['policy'].pk}/webhook-deliveries",
        "accounts:sso": "/accounts/sso/",
        "accounts:sso_callback": "/accounts/sso/callback/",
        "gateway:aggregate": "/mcp",
        "gateway:server": "/mcp/servers/alpha",
        "admin:index": "/admin/",
        "observability:metrics": "/metrics",
    }
    bodies = {
        "tasks:answer": {"action": "accept"},
        "api:launch_task": {"server": "alpha", "tool": "deploy", "arguments": {}},
        "api:answer": {"action": "accept", "content": {}},
        "api:create_policy": {"server": "beta", "tool": "deploy", "required_accepts": 2},
        "api:update_policy": {"server": "alpha", "groups": ["alpha-approvers"], "required_accepts": 2},
        "api:create_webhook": {"url": "http://127.0.0.1:9/new", "secret": "s"},
        "api:update_webhook": {"url": "http://127.0.0.1:9/hook", "enabled": False},
    }
    return urls[route], bodies.get(route, {})


CASES = [
    pytest.param(method, route, role, expected, id=f"{method} {route} as {role}")
    for (method, route), codes in MATRIX.items()
    for role, expected in zip(ROLES, codes, strict=True)
]


@pytest.mark.parametrize(("method", "route", "role", "expected"), CASES)
def test_route_answers_each_role_as_the_matrix_says(world, method, route, role, expected):
    url, body = request_for(method, route, world)
    user = world["users"].get(role)
    if route.startswith(("api:", "gateway:")):
        headers = {}
        if user is not None:
            headers["Authorization"] = f"Bearer {create_token(user=user, name='matrix')[1]}"
        client = Client(headers=headers)
        if method == "GET":
            response = client.get(url)
        else:
            response = client.generic(method, url, json.dumps(body), content_type="application/json")
    else:
        client = Client()
        if user is not None:
            client.force_login(user)
        response = client.post(url, body) if method == "POST" else client.get(url)
    assert response.status_code == expected, (
        f"{method} {url} ({route}) as {role}: expected {expected}, got {response.status_code}"
    )
    if (
        expected == LOGIN
        and role == "anonymous"
        and not route.startswith(("api:", "web:", "accounts:", "admin:", "gateway:"))
    ):
        assert response["Location"].startswith("/accounts/login/?next="), (
            f"{route} as anonymous: {response['Location']}"
        )
    if route.startswith("admin:"):
        assert response["Location"].startswith("/admin/login/?next="), f"{route} as {role}: {response['Location']}"


# --- the live socket ------------------------------------------------------------------------------------------


def socket(application, user=None) -> WebsocketCommunicator:
    headers = [(b"host", b"testserver"), (b"origin", b"http://testserver")]
    if user is not None:
        client = Client()
        client.force_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


@pytest.mark.django_db(transaction=True)
async def test_the_live_socket_refuses_anonymous(application, fresh_layer):
    communicator = socket(application)
    accepted, code = await communicator.connect()
    assert not accepted and code == CLOSE_NOT_SIGNED_IN
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_only_the_servers_approvers_hear_its_inbox(application, fresh_layer):
    alpha = await sync_to_async(create_server)(name="alpha", transport="http", url="http://127.0.0.1:9/a", user=None)
    group = await Group.objects.acreate(name="alpha-approvers")
    await sync_to_async(set_approver_groups)(alpha, [group])
    amy = await sync_to_async(make_user)("amy", APPROVERS, "alpha-approvers")
    ben = await sync_to_async(make_user)("ben", APPROVERS, "beta-approvers")
    launch = sync_to_async(services.launch)
    await sync_to_async(with_tools)(alpha, "deploy")
    task = await launch(server=alpha, tool="deploy", arguments={}, user=None)
    task = await sync_to_async(services.record_launch_outcome)(task=task, outcome=TaskCreated(task=snapshot("working")))

    sockets = {}
    for name, user in (("amy", amy), ("ben", ben)):
        sockets[name] = await sync_to_async(socket)(application, user)
        accepted, _ = await sockets[name].connect()
        assert accepted, name
        await sockets[name].receive_from(timeout=5)  # the nav counts, on connect

    # Ben tries to watch alpha's task too: refused silently.
    await sockets["ben"].send_json_to({"watch": str(task.pk)})
    assert await sockets["ben"].receive_nothing(timeout=0.3)

    secret = {**APPROVAL, "params": {"message": "Secret plan?", "requestedSchema": {}}}
    question = snapshot("input_required", inputRequests={"go": secret})
    await sync_to_async(services.apply_snapshot)(task=task, snapshot=question)

    heard = await sockets["amy"].receive_from(timeout=5)
    assert "Secret plan?" in heard or f"{task.pk}" in heard
    assert await sockets["ben"].receive_nothing(timeout=0.5), "an approver of another server heard alpha's inbox"
    for communicator in sockets.values():
        await communicator.disconnect()
