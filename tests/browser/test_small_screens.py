"""At a phone's size (390x844) the nav folds into a menu that opens with every link on the screen (issue 15 item 7).

That every page of every role fits the phone's width, nothing scrolling sideways, is checked on the accessibility
walk (test_accessibility.py), which looks at each page at 390 px already: a walk of its own took a minute of CI.
"""

import re

import pytest
from playwright.sync_api import expect

from tests.account_fixtures import TEST_PASSWORD
from tests.browser.page_walk import build_phone_world
from tests.browser_fixtures import PHONE, screenshot, sign_in

pytestmark = pytest.mark.slow


def test_the_nav_folds_into_a_menu_on_a_phone(daphne_server, page):
    _, users, kwargs = build_phone_world()
    base = daphne_server.url
    page.set_viewport_size(PHONE)
    sign_in(page, base, users["admin"].username, TEST_PASSWORD)
    expect(page.locator(".usermenu")).to_be_attached()
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
