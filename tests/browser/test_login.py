"""Signing in and out in a real browser; the nav shows each role what it may use."""

import re

import pytest
from playwright.sync_api import expect

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import screenshot, sign_in


def nav_items(page) -> list[str]:
    # The nav sits in a <details> menu that ui.js opens on a wide screen once the page has loaded.
    menu = page.locator("details.navmenu")  # a signed-in page's only; the CSP forbids wait_for_function's eval
    if menu.count():
        expect(menu).to_have_attribute("open", "")
    nav = page.get_by_role("navigation", name="Main")
    return [text.split()[0] for text in nav.get_by_role("listitem").all_inner_texts()]


def test_an_operator_signs_in_and_sees_launch_but_not_the_admin_pages(daphne_server, page):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    page.goto(daphne_server.url)
    page.get_by_role("link", name="Sign in").click()
    expect(page).to_have_title("Sign in · taskhub")
    expect(page.get_by_label("Username")).to_be_focused()
    screenshot(page, "login")

    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill(TEST_PASSWORD)
    page.get_by_role("button", name="Sign in").click()

    expect(page).to_have_url(f"{daphne_server.url}/")
    expect(page.locator(".usermenu")).to_contain_text("olga")
    assert nav_items(page) == ["Tasks", "Launch", "API"]
    screenshot(page, "home-operator")


def test_an_admin_who_approves_sees_every_page(daphne_server, page):
    make_user("alex", ADMINS, APPROVERS, password=TEST_PASSWORD)
    sign_in(page, daphne_server.url, "alex", TEST_PASSWORD)
    expect(page).to_have_url(f"{daphne_server.url}/")
    assert nav_items(page) == ["Tasks", "Inbox", "Launch", "Servers", "Approvals", "Audit", "People", "API"]
    screenshot(page, "home-admin")


def test_a_wrong_password_is_refused_with_a_clear_message(daphne_server, page):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    sign_in(page, daphne_server.url, "olga", "not the password")
    expect(page.get_by_role("alert")).to_contain_text("That username and password do not match an account")
    expect(page.get_by_label("Username")).to_have_value("olga")
    expect(page.get_by_label("Password")).to_have_value("")
    assert nav_items(page) == []
    screenshot(page, "login-wrong-password")


def test_signing_out_returns_to_the_sign_in_page(daphne_server, page):
    make_user("ada", APPROVERS, password=TEST_PASSWORD)
    sign_in(page, daphne_server.url, "ada", TEST_PASSWORD)
    # The page's live socket first: a handshake still on its way when the session ends is refused (403), which the
    # browser logs as an error.
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{daphne_server.url}/accounts/login/")
    expect(page.get_by_role("status").filter(has_text="signed out")).to_be_visible()
    screenshot(page, "signed-out")


def test_the_sign_in_page_in_dark_mode(daphne_server, new_page):
    page = new_page(color_scheme="dark")
    sign_in(page, daphne_server.url, "nobody", "nothing")
    expect(page.get_by_role("alert")).to_be_visible()
    screenshot(page, "login-dark")


@pytest.mark.slow
def test_daphne_serves_the_pages_and_keeps_the_session(daphne_server, page):
    make_user("olga", OPERATORS, password=TEST_PASSWORD)
    sign_in(page, daphne_server.url, "olga", TEST_PASSWORD)
    expect(page).to_have_url(f"{daphne_server.url}/")
    assert nav_items(page) == ["Tasks", "Launch", "API"]
    stylesheet = page.request.get(f"{daphne_server.url}/static/taskhub/taskhub.css")
    assert stylesheet.ok
    assert re.search(r"\.signin\s*\{", stylesheet.text())
