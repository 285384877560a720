"""With zh-Hans chosen, every page of every role says nothing of taskhub's own in English (issue 35 item 2).

The pages and the small world are tests/browser/page_walk.py's (the routes enumerated from the URLconf, so a page added
later is walked too). Each person chooses Chinese on their Notifications page, as a person would; then every page's
visible text (and its screen-reader text, titles, labels and placeholders) is read with what came from MCP servers
or from people taken out: the elements that show it (code, the server's words, tool and server names) and the world's
own strings. Any word of ASCII letters left that is not on ALLOWED is English taskhub forgot to translate.
"""

import re

import pytest
from django.db import connection
from playwright.sync_api import expect

from tests.account_fixtures import TEST_PASSWORD
from tests.browser import page_walk as walk
from tests.browser_fixtures import sign_in
from tests.csp_fixtures import QUESTION, TOOL

pytestmark = pytest.mark.slow

# Names and protocol words that stay as they are in Chinese text.
ALLOWED = {
    "taskhub", "mcp", "url", "json", "api", "utc", "id", "http", "https", "csv", "postgresql", "ttl", "uuid",
    "iserror", "ci", "readme", "javascript", "ctrl", "enter", "html", "png", "oauth", "stdio", "sse",
    "elicitation", "webhook", "webhooks", "streamable", "uri", "post", "authorization", "bearer", "basic", "slack",
    "true", "false", "null", "jwt", "pem", "rfc",
}  # fmt: skip
# Where a page shows what a server or a person sent (shown as sent), or an identifier; an audit event's data as it
# was recorded (its keys and values, as the export has them).
SERVERS_WORDS = (
    "code, pre, kbd, script, style, template, option, .server-text, .tool, .server, .ir-server, .ir-tool, "
    ".ir-headline, .ir-message-text, .ir-asks-field, .ir-host, .username, .short-id, .json, .brand, "
    ".ir-sampling-text, .ir-params, .event-data, .audit-data, [data-copy], input, textarea"
)
TEXT_OF_THE_PAGE = """(skip) => {
  const texts = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const parent = walker.currentNode.parentElement;
    if (parent && !parent.closest(skip) && parent.checkVisibility()) texts.push(walker.currentNode.textContent);
  }
  for (const element of document.querySelectorAll("[aria-label], [title], [placeholder], [alt]")) {
    if (element.closest(skip)) continue;
    for (const name of ["aria-label", "title", "placeholder", "alt"]) {
      if (element.hasAttribute(name)) texts.push(element.getAttribute(name));
    }
  }
  return texts.join("\\n");
}"""
WORD = re.compile(r"[A-Za-z][A-Za-z']+")
# Pages whose templates are not translated yet (issue 35 item 2 continues): each must still show English, so that
# one finished is taken off this list; every other page must show none.
PENDING: set[str] = set()


def english_left(text: str, world_strings: list[str]) -> set[str]:
    for known in world_strings:
        text = text.replace(known, " ")
    words = set()
    for match in WORD.finditer(text):
        word = match.group(0)
        before, after = text[match.start() - 1 : match.start()], text[match.end() : match.end() + 3]
        if word.lower() in ALLOWED or re.match(r"[/_:@.\"\d-]", before + "|") or re.match(r"[/_@\d-]|://", after + "|"):
            continue  # a name (tasks/get, input_required, a host, a key, a URL's scheme, a JSON string), not a word
        words.add(word)
    return words


def choose_chinese(page, base: str) -> None:
    page.goto(f"{base}/account/notifications/")
    page.locator("#id_language").select_option("zh-hans")
    page.locator("#language button[type=submit]").click()
    expect(page.locator("html")).to_have_attribute("lang", "zh-hans")


def test_every_page_in_chinese_for_every_role(daphne_server, new_page, console_errors):
    world, users, kwargs = walk.build_phone_world()
    with connection.cursor() as cursor:  # Home shows admins the database's version as Postgres says it
        cursor.execute("SELECT current_setting('server_version')")
        database_version = cursor.fetchone()[0]
    base = daphne_server.url
    world_strings = sorted(
        {
            walk.LONG,
            database_version,
            f"token {walk.LONG}",
            f"token {walk.LONG}"[:100],  # as an agent's label shows it
            f"https://hooks.example/{walk.LONG}",
            walk.LONG_KEY_TASK,
            QUESTION["params"]["message"],
            "Rendered the chart.",
            TOOL["description"],
            *(user.username for user in users.values()),
            world.server.name,
            world.server.url,
            "deploy",
            "staging",
            "prod",
            "target",
            "note",
            "Approve",
            "why",
            "demo-approvers",
            "approvers",
            "operators",
            "admins",
            "agents",
        },
        key=len,
        reverse=True,
    )
    opened, untranslated = set(), {}
    for user in users.values():
        page = new_page()
        sign_in(page, base, user.username, TEST_PASSWORD)
        choose_chinese(page, base)
        for name, route in walk.page_routes():
            path = walk.fill(route, kwargs)
            probe = page.request.get(f"{base}{path}", max_redirects=0)
            if probe.status not in (200, 403) or "text/html" not in (probe.headers.get("content-type") or ""):
                continue  # a POST endpoint, an export or a redirect: not a page
            if probe.status == 403:
                with console_errors.expect(page, "403"):
                    page.goto(f"{base}{path}")
            else:
                page.goto(f"{base}{path}")
            opened.add(name)
            words = english_left(page.evaluate(TEXT_OF_THE_PAGE, SERVERS_WORDS), world_strings)
            if words:
                untranslated.setdefault(name, set()).update(words)
    assert {"web:home", "tasks:list", "audit:list"} <= opened
    left = {name: words for name, words in untranslated.items() if name not in PENDING}
    report = "\n".join(f"{name}: {' '.join(sorted(words))}" for name, words in sorted(left.items()))
    assert not left, f"English left on these pages:\n{report}"
    finished = sorted(name for name in PENDING & opened if name not in untranslated)
    assert not finished, f"translated now: take them off PENDING: {finished}"
