"""Every page satisfies the strict Content-Security-Policy in a real browser, and the live socket still connects.

Violations are collected two ways: `securitypolicyviolation` events (an init script injected by Playwright, which
the page's CSP does not govern) and chromium's console messages about the policy.
"""

import pytest
from playwright.sync_api import expect

from tests.account_fixtures import TEST_PASSWORD
from tests.browser_fixtures import screenshot, sign_in
from tests.csp_fixtures import build_world

pytestmark = pytest.mark.slow

COLLECT_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(
    `${event.violatedDirective} blocked ${event.blockedURI || "inline"} at ${event.sourceFile}:${event.lineNumber}`
  );
});
"""


def test_every_page_satisfies_the_policy_and_the_socket_connects(daphne_server, page, console_errors):
    world = build_world()
    base = daphne_server.url
    console = []
    page.on("console", lambda message: console.append(f"{page.url}: {message.text}"))
    page.add_init_script(COLLECT_VIOLATIONS)
    violations = []

    def visit(path: str) -> None:
        page.goto(f"{base}{path}")
        page.wait_for_load_state("networkidle")
        violations.extend(f"{path}: {text}" for text in page.evaluate("window.__cspViolations || []"))

    visit("/accounts/login/")
    sign_in(page, base, "alex", TEST_PASSWORD)
    expect(page).to_have_url(f"{base}/")
    # The live socket connects under connect-src 'self' (ws: to the same host).
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")

    for path in world.pages():
        visit(path)
        if path == f"/tasks/{world.image_task.pk}/":
            image = page.locator("img[src^='data:image/png']")
            expect(image).to_be_visible()
            assert page.evaluate("(img) => img.naturalWidth", image.element_handle()) == 40
        if path == "/inbox/":
            expect(page.get_by_text("Approve deploy to staging?")).to_be_visible()
            expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
        if path == "/api/docs":
            expect(page.locator(".swagger-ui .info")).to_be_visible()
        if path == "/admin/":
            expect(page.locator("#site-name")).to_be_visible()
    screenshot(page, "csp-api-docs")

    # htmx did not fall back to an inline <style> for its indicators.
    visit("/")
    assert page.evaluate("document.querySelectorAll('style').length") == 0

    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{base}/accounts/login/")
    violations.extend(page.evaluate("window.__cspViolations || []"))

    policy_messages = [text for text in console if "Content Security Policy" in text]
    # The collectors work: an inline style added now is refused and reported both ways (the console message is
    # awaited by console_errors.expect, which also fails the test if it never comes).
    with console_errors.expect(page, "Content Security Policy"):
        page.evaluate("document.head.appendChild(document.createElement('style')).textContent = 'body{}'")
        page.wait_for_function("window.__cspViolations.length > 0")
    canary = page.evaluate("window.__cspViolations")
    assert any("style-src" in text for text in canary), canary
    assert any("Content Security Policy" in text for text in console), console

    assert violations == [], "\n".join(violations)
    assert policy_messages == [], "\n".join(policy_messages)
