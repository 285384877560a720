"""Every page at a phone's size (390x844): nothing scrolls sideways, the nav folds into a menu (issue 15 item 7).

The pages are enumerated from the URLconf, so a page added later is covered without editing this test: every
route of taskhub's apps (Django's admin site and the API's machine routes aside) is opened with the subjects of a
small world, signed in as each role. A route that only takes POST (405 to a GET) or answers something other than
HTML (an export) is no page and is left out by what it answers, not by a list. A route whose URL needs a value
this test does not know fails it: add the value to KWARGS.
"""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.page_walk import (  # noqa: F401  (LONG, LONG_KEY_TASK, fill: other walks read them here)
    LONG,
    LONG_KEY_TASK,
    build_phone_world,
    fill,
    page_routes,
    walk_pages,
)
from tests.browser_fixtures import screenshot

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}
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
        for name, path in walk_pages(page, base, user, routes, kwargs, console_errors, refused, role):
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
