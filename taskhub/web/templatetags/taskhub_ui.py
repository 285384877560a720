"""Small pieces every page shows the same way: status pills, times, short ids."""

import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from taskhub.tasks.models import TaskStatus

register = template.Library()

SERVER_STATUSES = frozenset({"working", "input_required", "completed", "failed", "cancelled"})
STATUS_WORDS = {"input_required": "needs input", **{status.value: status.label for status in TaskStatus}}
STATUS_WORDS["input_required"] = "needs input"


@register.simple_tag
def status_pill(status: str) -> str:
    """The one status colour of UI.md: filled for the server's five, outlined for taskhub's own states."""
    kind = f"status-{status}" if status in SERVER_STATUSES else "local"
    return format_html(
        '<span class="pill {}" data-status="{}">{}</span>', kind, status, STATUS_WORDS.get(status, status)
    )


@register.filter
def reltime(value: datetime.datetime | None) -> str:
    """`<time>` saying "3 min ago" (or "in 3 min"), with the exact UTC time on hover."""
    if not value:
        return format_html('<span class="muted">{}</span>', "—")
    now = timezone.now()
    exact = value.astimezone(datetime.UTC)
    if abs((now - value).total_seconds()) < 45:
        words = "just now"
    elif value <= now:
        words = f"{timesince(value, now, depth=1)} ago"
    else:
        words = f"in {timesince(now, value, depth=1)}"
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        exact.isoformat(),
        exact.strftime("%Y-%m-%d %H:%M:%S UTC"),
        words.replace("\xa0", " "),
    )


@register.filter
def short_id(value, length: int = 8) -> str:
    """The first characters of an id, the whole id on hover, and a copy button (static/taskhub/ui.js)."""
    text = str(value or "")
    if not text:
        return ""
    shown = text if len(text) <= length + 1 else f"{text[:length]}…"
    return format_html(
        '<span class="short-id"><code title="{}">{}</code>'
        '<button type="button" class="copy" data-copy="{}" aria-label="Copy {}">copy</button></span>',
        text,
        shown,
        text,
        text,
    )
