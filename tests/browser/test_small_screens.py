"""Every page at a phone's size (390x844): nothing scrolls sideways, the nav folds into a menu (issue 15 item 7).

The pages are enumerated from the URLconf, so a page added later is covered without editing this test: every
route of taskhub's apps (Django's admin site and the API's machine routes aside) is opened with the subjects of a
small world, signed in as each role. A route that only takes POST (405 to a GET) or answers something other than
HTML (an export) is no page and is left out by what it answers, not by a list. A route whose URL needs a value
this test does not know fails it: add the value to KWARGS.
"""

import re

import pytest
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
from tests.browser_fixtures import screenshot, sign_in
from tests.csp_fixtures import build_world
from tests.helpers import snapshot

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}
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


# The elements that stick out on the right, innermost first (to say what to fix, not only that something is off).
STICKING_OUT = """() => {
  const out = [];
  for (const element of document.querySelectorAll("body *")) {
    const box = element.getBoundingClientRect();
    if (box.right > window.innerWidth + 0.5 && box.width > 0) {
      if (![...element.children].some((child) => child.getBoundingClientRect().right > window.innerWidth + 0.5)) {
        out.push(`${element.tagName.toLowerCase()}.${[...element.classList].join(".")} (${Math.round(box.right)} px)`);
      }
    }
  }
  return out.slice(0, 5);
}"""


def fits(page) -> tuple[int, int]:
    return page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")


def test_every_page_fits_a_phone_for_every_role(daphne_server, new_page, console_errors):
    _, users, kwargs = build_phone_world()
    base = daphne_server.url
    routes = page_routes()
    assert any(name == "tasks:list" for name, _ in routes), routes  # the walk found the pages
    opened, refused, too_wide = set(), set(), []
    for role, user in users.items():
        page = new_page()
        page.set_viewport_size(PHONE)
        sign_in(page, base, user.username, TEST_PASSWORD)
        expect(page.locator(".usermenu")).to_be_attached()
        for name, route in routes:
            path = fill(route, kwargs)
            probe = page.request.get(f"{base}{path}", max_redirects=0)
            if probe.status == 405 or "text/html" not in (probe.headers.get("content-type") or ""):
                continue  # a POST endpoint or an export, not a page
            if probe.status != 200:
                if probe.status != 403 or role in refused:
                    continue  # a page not for this role: its refusal (one template) is checked once per role
                refused.add(role)
                with console_errors.expect(page, "403"):
                    page.goto(f"{base}{path}")
            else:
                page.goto(f"{base}{path}")
            page.wait_for_load_state("networkidle")
            opened.add(name)
            width, inner = fits(page)
            if width > inner:
                screenshot(page, f"phone-too-wide-{role}-{name.replace(':', '-')}")
                culprits = ", ".join(page.evaluate(STICKING_OUT))
                too_wide.append(f"{path} as {role}: {width} px wide in {inner} px: {culprits}")
    assert {"web:home", "tasks:list", "tasks:detail", "tasks:inbox", "servers:list", "audit:list"} <= opened
    assert too_wide == [], "\n".join(too_wide)
    # As the admin (the last role): the nav is folded into a menu that opens, and every link in it is on the screen.
    page.goto(f"{base}/tasks/")
    menu = page.locator("details.navmenu")
    expect(menu.locator("summary")).to_be_visible()
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Audit")).to_be_hidden()
    menu.locator("summary").click()
    for link in ("Tasks", "Inbox", "Launch", "Servers", "Audit", "Notifications"):
        expect(nav.get_by_role("link", name=re.compile(f"^{link}"))).to_be_in_viewport()
    expect(page.get_by_role("link", name="Notifications")).to_have_count(1)  # the user menu's moved into the nav
    expect(page.get_by_role("button", name="Sign out")).to_be_in_viewport()
    screenshot(page, "phone-menu-open")
    page.goto(f"{base}/tasks/")
    screenshot(page, "phone-tasks")
    page.goto(f"{base}/tasks/{kwargs['task_id']}/")
    screenshot(page, "phone-task-detail")
    page.goto(f"{base}/inbox/")
    screenshot(page, "phone-inbox")
    page.goto(f"{base}/servers/")
    screenshot(page, "phone-servers")
    page.goto(f"{base}/audit/")
    screenshot(page, "phone-audit")
