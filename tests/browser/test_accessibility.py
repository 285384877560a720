"""Every page of every role, at a desktop's width and a phone's, has no serious or critical axe-core violation
(issue 35 item 3), and at the phone's width nothing on it scrolls sideways (issue 15 item 7; the folded nav is
test_small_screens.py's).

The pages and the small world are tests/browser/page_walk.py's (routes enumerated from the URLconf, so a page added
later is checked too). axe-core is the copy axe-playwright-python ships (a dev dependency; only its script is used).
Each page is loaded once at 1280 px, checked, narrowed to 390 px (the phone's layout is CSS only: the nav folds into
its menu) and checked again, then checked in the dark theme (the system's, which the pages follow) for its colours'
contrast. One browser, one context per role; about 55-65 s. The phone's check rides on the same walk: each page
walked once more at 390 px took as long again (a minute of CI).
"""

import pytest
from axe_playwright_python.base import AXE_SCRIPT

from tests.browser.page_walk import build_phone_world, page_routes, walk_pages
from tests.browser_fixtures import PHONE, VIEWPORT, screenshot

pytestmark = pytest.mark.slow

# (what the failure calls it, viewport, colour scheme): both widths, and the dark theme's colours at the desktop's.
VIEWS = [("1280 px", VIEWPORT, "light"), ("390 px", PHONE, "light"), ("1280 px, dark theme", VIEWPORT, "dark")]
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
BLOCKING = {"serious", "critical"}
# WCAG 2.x A and AA and axe's best practices: what a page must pass, not the experimental rules.
RULES = {
    "runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]}
}


def blocking_violations(page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now, each with the nodes it found; axe is put
    into the page once (half a megabyte of script) and run as often as the page is looked at."""
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(AXE_SCRIPT)
    violations = page.evaluate("options => axe.run(document, options)", {**RULES, "resultTypes": ["violations"]})[
        "violations"
    ]
    return [described(violation) for violation in violations if violation["impact"] in BLOCKING]


def lasting_violations(page) -> list[str]:
    """The violations axe finds on the page and again a moment later: a live update landing while axe measures (the
    nav's counts, the live dot, a re-layout after the resize) can move what it measures once (a target-size seen
    on a phone's policy form, not again in dozens of runs); a violation of the page itself is there both times."""
    found = blocking_violations(page)
    if not found:
        return []
    page.wait_for_timeout(300)
    again = set(blocking_violations(page))
    return [violation for violation in found if violation in again]


def too_wide(page, where: str) -> str | None:
    """What sticks out sideways at the page's width, with a screenshot; None when the page fits."""
    width, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    if width <= inner:
        return None
    screenshot(page, f"phone-too-wide-{where}")
    return f"{width} px wide in {inner} px: {', '.join(page.evaluate(STICKING_OUT))}"


def described(violation: dict) -> str:
    nodes = violation["nodes"]
    targets = ", ".join(" >>> ".join(map(str, node["target"])) for node in nodes[:6])
    more = f" and {len(nodes) - 6} more" if len(nodes) > 6 else ""
    return f"{violation['id']} ({violation['impact']}: {violation['help']}) at {targets}{more}"


def test_every_page_has_no_serious_violation_and_fits_a_phone_for_every_role(daphne_server, new_page, console_errors):
    _, users, kwargs = build_phone_world()
    base = daphne_server.url
    routes = page_routes()
    assert any(name == "tasks:list" for name, _ in routes), routes  # the walk found the pages
    opened, refused, found, wide = set(), set(), [], []
    for role, user in users.items():
        page = new_page()
        for name, path in walk_pages(page, base, user, routes, kwargs, console_errors, refused, role):
            opened.add(name)
            for view, size, scheme in VIEWS:
                page.set_viewport_size(size)
                page.emulate_media(color_scheme=scheme)
                if size == PHONE and (sticking_out := too_wide(page, f"{role}-{name.replace(':', '-')}")):
                    wide.append(f"{path} as {role}: {sticking_out}")
                for violation in lasting_violations(page):
                    found.append(f"{name} ({path}) as {role} at {view}: {violation}")
            page.set_viewport_size(VIEWPORT)
            page.emulate_media(color_scheme="light")
    assert {"web:home", "tasks:list", "tasks:detail", "tasks:inbox", "servers:list", "audit:list"} <= opened
    assert found == [], f"{len(found)} serious or critical axe-core violations:\n" + "\n".join(found)
    assert wide == [], "pages wider than a phone:\n" + "\n".join(wide)


def test_the_check_finds_what_it_must(page):
    # The rules chosen do run: a page with a nameless field and button and faint text fails them.
    page.set_content(
        '<!doctype html><html lang="en"><head><title>broken</title></head><body><main>'
        '<input type="text"><button></button><p style="color: #bbb; background: #fff">faint</p></main></body></html>'
    )
    found = " ".join(lasting_violations(page))
    for rule in ("label", "button-name", "color-contrast"):
        assert f"{rule} (" in found, found


def test_the_phone_check_names_what_sticks_out(page):
    page.set_viewport_size(PHONE)
    page.set_content('<!doctype html><html lang="en"><body><main><p>fits</p></main></body></html>')
    assert too_wide(page, "fits") is None
    page.set_content(
        '<!doctype html><html lang="en"><body><main><pre class="wide" style="width: 600px">x</pre></main></body></html>'
    )
    sticking_out = too_wide(page, "check")
    assert sticking_out is not None and "pre.wide" in sticking_out, sticking_out
