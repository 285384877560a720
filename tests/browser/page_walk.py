"""The page walk shared by the browser tests that open every page as every role (small screens, Chinese).

page_routes() enumerates taskhub's named routes from the URLconf (Django's admin site, the API and the gateway
aside), fill() puts the small world's values into a route, build_phone_world() makes that world (a server, tasks
with long unbroken strings where a server or a person can put them, an approver, an operator, an admin) and the
values of every URL argument, and walk_pages() signs a page in as a role and opens each page that role may see,
yielding (route name, path) with the page loaded. A route that only takes POST (405 to a GET), answers something
other than HTML (an export) or a part of a page (no doctype: what htmx polls for) is no page; a refusal (403, one
template) is opened once per role.
"""

import re

from django.contrib.auth.models import Group
from django.urls import URLPattern, URLResolver, get_resolver
from playwright.sync_api import expect

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.approvals.models import PolicyWebhook
from taskhub.mcp.client import TaskCreated
from taskhub.tasks import services
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.approval_fixtures import set_approver_groups
from tests.browser_fixtures import sign_in
from tests.csp_fixtures import build_world
from tests.helpers import snapshot

SKIPPED_NAMESPACES = {
    "admin",
    "api",
    "gateway",
}  # Django's own admin site; the API's JSON and its Swagger page; the MCP gateway
LONG = "a-very-long-unbroken-identifier-" * 6
LONG_KEY_TASK = "9f0c2d1e-4b7a-4c2e-9d3f-0a1b2c3d4e5f"


def page_routes() -> list[tuple[str, URLPattern, str]]:
    """(name, pattern, regex route) of every named route outside SKIPPED_NAMESPACES."""
    found = []

    def walk(patterns, namespace: str, prefix: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                inner = f"{namespace}:{pattern.namespace}" if namespace and pattern.namespace else pattern.namespace
                if (inner or namespace) in SKIPPED_NAMESPACES:
                    continue
                walk(pattern.url_patterns, inner or namespace, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern) and pattern.name:
                found.append(
                    (f"{namespace}:{pattern.name}" if namespace else pattern.name, prefix + str(pattern.pattern))
                )

    walk(get_resolver().url_patterns, "", "")
    return found


def fill(route: str, values: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1).split(":")[-1]
        assert name in values, f"{route}: no value for <{name}>; add one to the test's KWARGS"
        return str(values[name])

    path = re.sub(r"<([^>]+)>", value, route)
    return "/" + path.lstrip("^").rstrip("$")


def build_phone_world():
    world = build_world()
    alpha_approvers = Group.objects.create(name="demo-approvers")
    policy = set_approver_groups(world.server, [alpha_approvers])
    world.admin.groups.add(alpha_approvers)  # so the admin's inbox (screenshot) has the cards too
    # Long, unbroken strings where a server or a person can put them: a tool name, a status message, keys.
    task = services.launch(
        server=world.server, tool="deploy", arguments={"target": "prod", "note": LONG}, user=world.admin
    )
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=LONG_KEY_TASK)))
    asks = {
        f"{LONG_KEY_TASK}:{digest}": {
            "method": "elicitation/create",
            "params": {"message": f"Approve {LONG}?", "requestedSchema": {"type": "object"}},
        }
        for digest in ("5d41402abc4b2a76b9719d911017c592", "7d793037a0760186574b0282f2f435e7")
    }
    services.apply_snapshot(
        task=task,
        snapshot=snapshot("input_required", task_id=LONG_KEY_TASK, statusMessage=LONG, inputRequests=asks),
    )
    users = {
        "approver": make_user("amy", APPROVERS, "demo-approvers", password=TEST_PASSWORD),
        "operator": make_user("olga", OPERATORS, password=TEST_PASSWORD),
        "admin": world.admin,
    }
    kwargs = {
        "server_id": world.server.pk,
        "task_id": task.pk,
        "tool": "deploy",
        "request_id": world.input_request.pk,
        "policy_id": policy.pk,
        "webhook_id": PolicyWebhook.objects.create(policy=policy, url=f"https://hooks.example/{LONG}", secret="s").pk,
        "fmt": "csv",
        "token_id": create_token(user=world.admin, name=f"token {LONG}")[0].pk,
        "user_id": users["operator"].pk,
    }
    return world, users, kwargs


def walk_pages(page, base: str, user, routes, kwargs, console_errors, refused: set[str], role: str):
    """Sign page in as user and open every page of routes the role may see; yields (name, path) once loaded."""
    sign_in(page, base, user.username, TEST_PASSWORD)
    expect(page.locator(".usermenu")).to_be_attached()
    for name, route in routes:
        path = fill(route, kwargs)
        probe = page.request.get(f"{base}{path}", max_redirects=0)
        if probe.status == 405 or "text/html" not in (probe.headers.get("content-type") or ""):
            continue  # a POST endpoint or an export, not a page
        if probe.status == 200 and not probe.text().lstrip().lower().startswith("<!doctype html"):
            continue  # a part of a page that htmx asks for (servers:discovery), shown inside its page
        if probe.status != 200:
            if probe.status != 403 or role in refused:
                continue  # a page not for this role: its refusal (one template) is checked once per role
            refused.add(role)
            with console_errors.expect(page, "403"):
                page.goto(f"{base}{path}")
        else:
            page.goto(f"{base}{path}")
        page.wait_for_load_state("networkidle")
        yield name, path
