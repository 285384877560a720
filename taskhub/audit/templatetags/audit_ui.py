"""Audit event details, compact: `{{ event.data|audit_details }}` renders `key: value` pairs, escaped and capped.

Event data can carry text an MCP server sent (status messages, errors), so everything goes through
format_html / escaping, long values are cut, and an odd shape (a list, a string, deep nesting) is shown as
JSON text rather than trusted to be a flat dict.
"""

import json
from typing import Any

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext

register = template.Library()

VALUE_CHARS = 160
MAX_KEYS = 8
FULL_CHARS = 5000


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def capped(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (f"{text[: limit - 1]}…", True)


@register.filter
def audit_details(data: Any) -> str:
    if data in (None, {}, [], ""):
        return format_html('<span class="muted">{}</span>', "—")
    truncated = False
    if isinstance(data, dict):
        pairs = []
        for key, value in list(data.items())[:MAX_KEYS]:
            text, cut = capped(as_text(value), VALUE_CHARS)
            truncated |= cut
            pairs.append((capped(str(key), 40)[0], text))
        more = len(data) - MAX_KEYS
        truncated |= more > 0
        body = format_html(
            '<dl class="audit-data">{}{}</dl>',
            format_html_join("", "<div><dt>{}</dt><dd>{}</dd></div>", pairs),
            format_html('<div class="more">{}</div>', gettext("+%(count)s more") % {"count": more}) if more > 0 else "",
        )
    else:
        text, truncated = capped(as_text(data), VALUE_CHARS)
        body = format_html('<code class="audit-data">{}</code>', text)
    if not truncated:
        return body
    full, _ = capped(json.dumps(data, ensure_ascii=False, indent=2, default=str), FULL_CHARS)
    return format_html(
        '{}<details class="audit-full"><summary>{}</summary><pre>{}</pre></details>', body, gettext("all details"), full
    )
