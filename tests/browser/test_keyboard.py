"""An approver answers with the keyboard alone, the focus visible at every step (issue 35 item 3).

In real processes (tests/browser/test_flows.py's stack: the demo MCP server, two workers, daphne on Redis): an
operator launches a form-mode and a URL-mode question; the approver signs in, reaches the inbox, answers the form
there and opens the URL request's task to consent on its page, by Tab, Shift+Tab, Enter, Space and typing only (no
click, no fill). After every key the element that has the focus is checked: something has it (not the page's body),
it draws a focus ring (an outline or a box shadow), and it is on the screen, not under the sticky top bar. axe-core
looks at the inbox and the task page too, with the real questions' cards on them.
"""

import re

import pytest
from playwright.sync_api import Page, expect

from taskhub.tasks.models import InputRequest
from tests.account_fixtures import TEST_PASSWORD
from tests.browser.test_accessibility import blocking_violations
from tests.browser.test_flows import (  # noqa: F401 (the stack's fixtures)
    launch,
    people,
    signed_in,
    stack,
    stack_processes,
    transport,
    wait_for_request,
    wait_live,
)
from tests.browser_fixtures import screenshot
from tests.stack_fixtures import in_own_thread

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# What is wrong with how the focused element shows (an empty string when nothing is).
FOCUS_PROBLEM = """() => {
  const element = document.activeElement;
  if (!element || element === document.body) return "nothing has the focus";
  const name = `${element.tagName.toLowerCase()}#${element.id}.${[...element.classList].join(".")}`;
  const style = getComputedStyle(element);
  const outline = style.outlineStyle !== "none" && parseFloat(style.outlineWidth) > 0;
  const shadow = style.boxShadow && style.boxShadow !== "none";
  if (!outline && !shadow) return `${name} has the focus but draws no outline or box shadow`;
  const box = element.getBoundingClientRect();
  const x = Math.min(Math.max(box.left + Math.min(box.width, 40) / 2, 0), window.innerWidth - 1);
  const y = box.top + box.height / 2;
  if (y < 0 || y > window.innerHeight) return `${name} has the focus off the screen (at ${Math.round(y)} px)`;
  const seen = document.elementFromPoint(x, y);
  const label = seen && seen.closest("label");
  if (seen && !element.contains(seen) && !seen.contains(element) && !(label && label.control === element)) {
    return `${name} has the focus under ${seen.tagName.toLowerCase()}.${[...seen.classList].join(".")}`;
  }
  return "";
}"""
MOST_TABS = 80


FOCUSED = """() => {
  const element = document.activeElement;
  if (!element || element === document.body) return "the page's body";
  const text = (element.textContent || element.value || "").trim().slice(0, 40);
  return `${element.tagName.toLowerCase()}#${element.id}.${[...element.classList].join(".")} "${text}"`;
}"""


def press(page: Page, key: str) -> None:
    before = page.evaluate(FOCUSED)
    page.keyboard.press(key)
    assert_focus_visible(page, f"{key} from {before}")


def assert_focus_visible(page: Page, after: str) -> None:
    problem = page.evaluate(FOCUS_PROBLEM)
    assert not problem, f"after {after}: {problem}"


# Whether `element` comes before the focus in the page (false when nothing has the focus).
ABOVE_THE_FOCUS = """element => {
  const active = document.activeElement;
  if (!active || active === document.body) return false;
  return Boolean(active.compareDocumentPosition(element) & Node.DOCUMENT_POSITION_PRECEDING);
}"""


def tab_to(page: Page, selector: str) -> None:
    """Presses Tab until the focus is on the element `selector` names, or Shift+Tab if it is above the focus (as a
    person would: two requests' cards come in the order they were asked, which two workers do not promise), checking
    the focus each time."""
    target = page.locator(selector)
    expect(target).to_have_count(1)
    if target.evaluate("element => element === document.activeElement"):
        return  # there already (a sign-in form's autofocus)
    key = "Shift+Tab" if target.evaluate(ABOVE_THE_FOCUS) else "Tab"
    for _ in range(MOST_TABS):
        press(page, key)
        if target.evaluate("element => element === document.activeElement"):
            return
    raise AssertionError(f"{selector} was not reached in {MOST_TABS} presses of {key}")


def type_here(page: Page, selector: str, text: str) -> None:
    expect(page.locator(selector)).to_be_focused()
    page.keyboard.type(text)
    assert_focus_visible(page, f"typing {text!r}")


def accept_and_see_it_delivered(page: Page, card: str, shot: str) -> None:
    """Tab to the card's Accept, press Enter; the card says so, turns "delivered ✓" live (replaced by the socket's
    push), and the focus stays on it, visible."""
    tab_to(page, f"{card} button[data-accept]")
    screenshot(page, shot)
    press(page, "Enter")
    expect(page.locator(card)).to_contain_text("answered by you")
    expect(page.locator(card)).to_contain_text("delivered ✓", timeout=15_000)
    expect(page.locator(card)).to_be_focused()
    assert_focus_visible(page, "the card was answered and then delivered")


def request_id(task_id: str) -> int:
    return in_own_thread(InputRequest.objects.values_list("pk", flat=True).get, task_id=task_id)


def test_an_approver_answers_a_form_and_a_url_request_with_the_keyboard_alone(new_page, stack):  # noqa: F811
    operator = signed_in(new_page, stack, "olga")
    # The URL request is asked first, so its card is above the form's and the approver goes back up to it with
    # Shift+Tab: the same path every run (left to two workers, the order came out either way).
    url_task = launch(operator, stack, "url_consent")
    wait_for_request(url_task, timeout=30)
    form_task = launch(operator, stack, "approval", {"action": "deploy to staging"})
    wait_for_request(form_task, timeout=30)
    form_card, url_card = f"#ir-{request_id(form_task)}", f"#ir-{request_id(url_task)}"

    approver = new_page()
    opened_hosts: list[str] = []
    approver.context.on("request", lambda request: opened_hosts.append(request.url))
    approver.context.route("https://example.com/**", lambda route: route.fulfill(body="authorized", status=200))
    approver.goto(f"{stack.url}/accounts/login/")
    tab_to(approver, "input[name=username]")
    type_here(approver, "input[name=username]", "arun")
    press(approver, "Tab")
    type_here(approver, "input[name=password]", TEST_PASSWORD)
    approver.keyboard.press("Enter")
    expect(approver.locator(".usermenu")).to_contain_text("arun")

    # Finds the waiting requests: the Inbox in the top bar (its count says how many), then the form's card.
    tab_to(approver, "nav.mainnav a[href='/inbox/']")
    approver.keyboard.press("Enter")
    expect(approver).to_have_url(re.compile(r"/inbox/$"))
    wait_live(approver)
    expect(approver.locator(form_card)).to_contain_text("Approve deploy to staging?")
    assert blocking_violations(approver) == []  # axe-core on the inbox with a real form's and a URL's cards
    tab_to(approver, f"{form_card} input[type=checkbox]")
    press(approver, "Space")
    expect(approver.locator(f"{form_card} input[type=checkbox]")).to_be_checked()
    reason = f"{form_card} .ir-field:not(.ir-field-checkbox) :is(input, textarea)"
    tab_to(approver, reason)
    type_here(approver, reason, "keyboard only")
    # Back a step to check what was typed is still there, then on to Accept.
    press(approver, "Tab")
    press(approver, "Shift+Tab")
    expect(approver.locator(reason)).to_be_focused()
    expect(approver.locator(reason)).to_have_value("keyboard only")
    accept_and_see_it_delivered(approver, form_card, "keyboard-inbox-accept-focused")
    operator.goto(f"{stack.url}/tasks/{form_task}/")
    expect(operator.get_by_text("approved: deploy to staging (reason: keyboard only)")).to_be_visible(timeout=15_000)

    # The URL request: its task's page, reached from its card, where it is answered too.
    operator.goto(f"{stack.url}/tasks/{url_task}/")
    tab_to(approver, f"{url_card} a[href='/tasks/{url_task}/']")
    approver.keyboard.press("Enter")
    expect(approver).to_have_url(re.compile(rf"/tasks/{url_task}/$"))
    wait_live(approver)
    assert not [url for url in opened_hosts if "example.com" in url]
    assert blocking_violations(approver) == []
    tab_to(approver, f"{url_card} a.ir-url-open")
    with approver.context.expect_page() as opened:
        approver.keyboard.press("Enter")
    opened.value.close()
    assert [url for url in opened_hosts if "example.com" in url]
    approver.bring_to_front()
    accept_and_see_it_delivered(approver, url_card, "keyboard-task-url-accept-focused")
    expect(operator.get_by_text("consented")).to_be_visible(timeout=15_000)
