"""People management in a real browser (issue 34, Deliver 2 and item 6): an admin adds a person from the People page
and hands over the password shown once; deactivating them closes their open page's live socket at once, and their
next page is the sign-in."""

import pytest
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import screenshot, sign_in

pytestmark = pytest.mark.slow


def test_an_admin_adds_a_person_then_deactivating_them_ends_their_open_page(daphne_server, new_page):
    make_user("alex", ADMINS, password=TEST_PASSWORD)
    admin = new_page()
    sign_in(admin, daphne_server.url, "alex", TEST_PASSWORD)
    admin.get_by_role("link", name="People").click()
    admin.get_by_label("Username").fill("dana")
    admin.get_by_label("operator: launches and cancels").check()
    admin.get_by_role("button", name="Add person").click()
    expect(admin.locator("#person-added")).to_contain_text("dana can sign in now")
    password = admin.locator("#new-password").inner_text()
    expect(admin.locator("#person-added")).to_be_visible()

    dana = new_page()
    sign_in(dana, daphne_server.url, "dana", password)
    dana.goto(f"{daphne_server.url}/tasks/")
    expect(dana.locator("#live-indicator")).to_have_attribute("data-state", "live")

    admin.get_by_role("link", name="dana").click()
    screenshot(admin, "person")
    admin.get_by_role("button", name="Deactivate dana").click()
    expect(admin.get_by_role("status").filter(has_text="dana is deactivated")).to_contain_text("1 session(s) ended")
    expect(dana.locator("#live-indicator")).to_have_attribute("data-state", "offline")
    dana.reload()
    expect(dana).to_have_url(f"{daphne_server.url}/accounts/login/?next=/tasks/")
