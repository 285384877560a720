"""What the task pages show, shaped from what an MCP server sent: results, errors, the timeline, protocol facts;
and the whole of the detail page (detail_context), which its view and its live fragments render.

Everything here is untrusted input from a server. These functions never mark anything safe: they return plain
values that the templates autoescape, cap every long text, and never fail on an odd shape (a `content` that is
not a list, an item that is not a dict, base64 that does not decode…): an unexpected value is shown as JSON.
"""

import base64
import binascii
import datetime
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.urls import reverse
from django.utils.translation import gettext

from taskhub.accounts import permissions
from taskhub.audit.models import AuditEvent
from taskhub.tasks.capped_text import TEXT_CAP, Capped, cap, compact_json, pretty_json
from taskhub.tasks.durations import duration_text
from taskhub.tasks.input_cards import card_for, number_siblings
from taskhub.tasks.models import (
    CANCELLED_NOT_SENT,
    LIVE_STATUSES,
    InputRequestState,
    ProgressMessage,
    ServerLogLine,
    Task,
    TaskStatus,
    may_have_input_requests,
)

IMAGE_CAP_BYTES = 2 * 1024 * 1024  # decoded bytes of one inline image
CONTENT_ITEMS_CAP = 100
TIMELINE_CAP = 500
SERVER_LOG_SHOWN = 100  # of the SERVER_LOG_LINES_KEPT a task keeps (tasks/services/progress.py)
PROGRESS_SHOWN = 100  # of the progress history a task keeps (the same module)
# Raster types only: an SVG can carry script, so it is never shown inline.
INLINE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
CLICKABLE_SCHEMES = frozenset({"http", "https"})
CLOSED_CARDS_SENT = 20
REQUEST_CARDS_SHOWN = 200


def _base64_size(data: Any) -> int | None:
    """Decoded size of base64 text, or None when it is not base64."""
    if not isinstance(data, str):
        return None
    stripped = data.strip()
    if len(stripped) % 4:
        return None
    padding = stripped[-2:].count("=")
    return len(stripped) // 4 * 3 - padding


def _mime(value: Any) -> str:
    return value.split(";", 1)[0].strip().lower() if isinstance(value, str) else ""


def clickable_url(uri: Any) -> str | None:
    """The URI when it is a plain web address (http/https with a host); None for javascript:, data:, file: …"""
    if not isinstance(uri, str):
        return None
    try:
        parts = urlsplit(uri.strip())
    except ValueError:
        return None
    if parts.scheme.lower() in CLICKABLE_SCHEMES and parts.netloc:
        return uri.strip()
    return None


@dataclass
class ContentItem:
    kind: str  # text, image, image_refused, audio, resource_link, resource_text, resource_blob, unknown
    text: Capped | None = None
    mime: str = ""
    size: int | None = None
    data_url: str = ""
    reason: str = ""
    name: str = ""
    uri: str = ""
    href: str | None = None
    description: str = ""
    raw: Capped | None = None


def _image(item: dict) -> ContentItem:
    mime = _mime(item.get("mimeType"))
    data = item.get("data")
    size = _base64_size(data)
    if mime not in INLINE_IMAGE_TYPES:
        shown = mime or "no type"
        return ContentItem("image_refused", mime=mime, size=size, reason=f"images of type {shown} are not shown")
    if size is None:
        return ContentItem("image_refused", mime=mime, reason="the image data is not valid base64")
    if size > IMAGE_CAP_BYTES:
        return ContentItem(
            "image_refused", mime=mime, size=size, reason=f"the image is larger than {IMAGE_CAP_BYTES // 1024} KiB"
        )
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return ContentItem("image_refused", mime=mime, reason="the image data is not valid base64")
    return ContentItem("image", mime=mime, size=size, data_url=f"data:{mime};base64,{data.strip()}")


def _resource(item: dict) -> ContentItem:
    resource = item.get("resource")
    if not isinstance(resource, dict):
        return ContentItem("unknown", raw=pretty_json(item))
    uri = resource.get("uri") if isinstance(resource.get("uri"), str) else ""
    mime = resource.get("mimeType") if isinstance(resource.get("mimeType"), str) else ""
    if isinstance(resource.get("text"), str):
        return ContentItem("resource_text", uri=cap(uri, 2000).text, mime=mime, text=cap(resource["text"]))
    if "blob" in resource:
        return ContentItem("resource_blob", uri=cap(uri, 2000).text, mime=mime, size=_base64_size(resource["blob"]))
    return ContentItem("unknown", raw=pretty_json(item))


def content_item(item: Any) -> ContentItem:
    if not isinstance(item, dict):
        return ContentItem("unknown", raw=pretty_json(item))
    kind = item.get("type")
    if kind == "text":
        return ContentItem("text", text=cap(item.get("text")))
    if kind == "image":
        return _image(item)
    if kind == "audio":
        return ContentItem("audio", mime=_mime(item.get("mimeType")), size=_base64_size(item.get("data")))
    if kind == "resource_link":
        uri = item.get("uri") if isinstance(item.get("uri"), str) else ""
        name = item.get("title") or item.get("name") or uri
        return ContentItem(
            "resource_link",
            name=cap(name if isinstance(name, str) else str(name), 500).text,
            uri=cap(uri, 2000).text,
            href=clickable_url(uri) if len(uri) <= 2000 else None,
            mime=item.get("mimeType") if isinstance(item.get("mimeType"), str) else "",
            description=cap(item.get("description") or "", 2000).text,
        )
    if kind == "resource":
        return _resource(item)
    return ContentItem("unknown", raw=pretty_json(item))


@dataclass
class ResultView:
    is_error: bool = False
    items: list[ContentItem] = field(default_factory=list)
    items_left_out: int = 0
    structured: Capped | None = None
    raw: Capped | None = None  # a result that is not an object at all


def present_result(result: Any) -> ResultView | None:
    if result is None:
        return None
    if not isinstance(result, dict):
        return ResultView(raw=pretty_json(result))
    view = ResultView(is_error=result.get("isError") is True)
    content = result.get("content")
    if isinstance(content, list):
        view.items = [content_item(item) for item in content[:CONTENT_ITEMS_CAP]]
        view.items_left_out = max(0, len(content) - CONTENT_ITEMS_CAP)
    elif content is not None:
        view.items = [ContentItem("unknown", raw=pretty_json(content))]
    if "structuredContent" in result:
        view.structured = pretty_json(result["structuredContent"])
    return view


@dataclass
class ErrorView:
    code: str = ""
    message: Capped | None = None
    data: Capped | None = None


def present_error(error: Any) -> ErrorView | None:
    if error is None:
        return None
    if not isinstance(error, dict):
        return ErrorView(message=cap(compact_json(error, TEXT_CAP)))
    code = error.get("code")
    return ErrorView(
        code="" if code is None else cap(str(code), 100).text,
        message=cap(error.get("message")) if error.get("message") is not None else None,
        data=pretty_json(error["data"]) if "data" in error else None,
    )


# --- the timeline ------------------------------------------------------------------------------------

_STATUS_VALUES = frozenset(TaskStatus.values)


def event_status(action: str, data: Any) -> str:
    """The task status an audit event records, for the colour of its dot; "" when it records none."""
    data = data if isinstance(data, dict) else {}
    status = ""
    if action in ("task.status_changed", "task.expired"):
        status = data.get("to") or ("expired" if action == "task.expired" else "")
    elif action == "task.launch_answered":
        outcome = data.get("outcome")
        status = {"complete": "failed" if data.get("is_error") else "completed", "input_required": "input_required"}
        status = status.get(outcome) or data.get("status") or ""
    elif action == "task.lost":
        status = TaskStatus.LOST
    elif action in ("task.launched", "task.launch_retrying", "task.launch_withdrawn"):
        status = TaskStatus.LAUNCHING
    elif action == "task.launch_unknown":
        status = TaskStatus.LAUNCH_UNKNOWN
    elif action == "task.launch_failed":
        status = TaskStatus.FAILED
    elif action == "task.input_requested":
        status = TaskStatus.INPUT_REQUIRED
    return str(status) if status in _STATUS_VALUES else ""


@dataclass
class TimelineEntry:
    id: int
    time: datetime.datetime
    actor: str
    action: str
    description: str
    status: str
    data: str


def timeline(task: Task) -> tuple[list[TimelineEntry], int]:
    """Every audit event of the task, newest last (the latest TIMELINE_CAP), and how many earlier were left out; with
    the lines its server logged during its calls (the latest SERVER_LOG_SHOWN) in their place."""
    events = AuditEvent.objects.filter(task_id=task.pk)
    newest = list(events.order_by("-time", "-id")[:TIMELINE_CAP])
    # Counted only when the cap was reached: fewer are all there are (a statement less on every live change).
    earlier = events.count() - len(newest) if len(newest) == TIMELINE_CAP else 0
    newest.reverse()
    entries = _audit_entries(newest)
    logged = ServerLogLine.objects.filter(task_id=task.pk).order_by("-at", "-pk")[:SERVER_LOG_SHOWN]
    logged = list(logged) if task.server_log_lines else []  # none: a query less
    if logged:
        logged.reverse()
        lines = [
            TimelineEntry(
                id=-line.pk,
                time=line.at,
                actor=f"server{f' ({line.logger})' if line.logger else ''}",
                action="server.log",
                description=gettext("server log: %(level)s") % {"level": line.level},
                status="",
                data=line.text,
            )
            for line in logged
        ]
        entries = sorted([*entries, *lines], key=lambda entry: entry.time)
    said = ProgressMessage.objects.filter(task_id=task.pk).order_by("-number")[:PROGRESS_SHOWN]
    said = list(reversed(said)) if task.progress_updates else []  # none: a query less
    if said:  # the progress history: status messages alone, not audit (ids apart from the log lines' negative ones)
        progress = [
            TimelineEntry(-(10**12) - m.pk, m.at, "server", "task.progress", gettext("progress"), "", m.text)
            for m in said
        ]
        entries = sorted([*entries, *progress], key=lambda entry: entry.time)
    return entries, max(0, earlier)


def _audit_entries(newest: list[AuditEvent]) -> list[TimelineEntry]:
    return [
        TimelineEntry(
            id=event.pk,
            time=event.time,
            actor=(
                gettext("%(actor)s via %(agent)s") % {"actor": event.shown_actor, "agent": event.agent}
                if event.agent
                else event.shown_actor
            ),
            action=event.action,
            description=event.shown_description,
            status=event_status(event.action, event.data),
            data=compact_json(event.data) if event.data else "",
        )
        for event in newest
    ]


# --- protocol facts ----------------------------------------------------------------------------------


def parse_remote_time(value: str) -> datetime.datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def duration_words(ms: int | None) -> str:
    return duration_text(ms / 1000) if ms else ""


@dataclass
class Facts:
    remote_created: datetime.datetime | None
    expires: datetime.datetime | None
    ttl: str
    poll_interval: str
    next_poll: datetime.datetime | None


def facts(task: Task) -> Facts:
    created = parse_remote_time(task.remote_created_at)
    try:
        next_poll = task.poll.next_poll_at
    except Task.poll.RelatedObjectDoesNotExist:
        next_poll = None
    return Facts(
        remote_created=created,
        expires=task.expires_at,
        ttl=duration_words(task.ttl_ms),
        poll_interval=duration_words(task.poll_interval_ms),
        next_poll=next_poll,
    )


# --- the cancel line of the header -------------------------------------------------------------------


def _cancelled_not_sent(task: Task) -> bool:
    return AuditEvent.objects.filter(
        task=task, action="task.status_changed", data__source=CANCELLED_NOT_SENT, data__sent=False
    ).exists()


def cancel_state(task: Task) -> str:
    """ "" (no cancel asked), "requested" (until the task ends), "still_working" (the server was told and still
    reports the task working), "cancelled" (it ended as asked), "finished_anyway" (it completed or failed after
    the request), "ended" (expired after the request), "not_sent" (cancelled while launching, before the tool call
    was sent)."""
    if task.cancel_requested_at is None:
        return ""
    if not task.is_terminal:
        if task.cancel_delivered_at is not None and task.status == TaskStatus.WORKING:
            return "still_working"
        return "requested"
    if task.status == TaskStatus.CANCELLED:
        if task.remote_task_id is None and _cancelled_not_sent(task):
            return "not_sent"
        return "cancelled"
    if task.status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
        return "finished_anyway"
    return "ended"


# --- the detail page ---------------------------------------------------------------------------------


def detail_context(task: Task, user) -> dict:
    """Everything the detail page and its live fragments show; the live renderers call this too."""
    return {**status_context(task, user), **details_context(task, user)}


def status_context(task: Task, user) -> dict:
    """What the detail page's header and status message show: the task as it stands and what the user may do about
    it, without a query of its own (the live socket sends these first: taskhub/live/task_fragments.py)."""
    return {
        "task": task,
        "may_cancel": permissions.may_cancel(user, task),
        "cancel_offered": (
            permissions.may_cancel(user, task)
            and not task.is_terminal
            and task.cancel_requested_at is None
            and task.status != TaskStatus.LAUNCH_UNKNOWN
            and task.server.removed_at is None
        ),
        "cancel_state": cancel_state(task),
        # Run again: the launch form of the same server and tool, filled with this task's arguments.
        "run_again_href": (
            f"{reverse('tasks:launch_tool', args=[task.server_id, task.tool])}?again={task.pk}"
            if permissions.may_launch(user, task.server)
            else ""
        ),
        # The tracker claims no task of a disabled server (taskhub/worker/tracker/leases.py, CLAIM_SQL).
        "polling_paused": (
            task.remote_task_id is not None and task.status in LIVE_STATUSES and not task.server.enabled
        ),
    }


def details_context(task: Task, user) -> dict:
    """What the detail page shows below the status: input requests, result, facts, timeline."""
    entries, earlier = timeline(task)
    requests = task.input_requests.select_related("answered_by").order_by("created_at", "pk")
    requests = list(requests) if may_have_input_requests(task) else []  # none: a query less (the live socket's read)
    for input_request in requests:
        input_request.task = task
    here = reverse("tasks:detail", args=[task.pk])
    open_requests = [ir for ir in requests if ir.state == InputRequestState.OPEN and not task.is_terminal]
    # The page shows every request, answered ones with who answered and when; live, the cards closed lately
    # replace their open version wherever a page still shows it (the newest few suffice).
    open_ids = {ir.pk for ir in open_requests}
    closed = [ir for ir in requests if ir.pk not in open_ids][-CLOSED_CARDS_SENT:]
    shown = requests[-REQUEST_CARDS_SHOWN:]
    return {
        "task": task,
        "open_requests": open_requests,
        "request_cards": number_siblings([card_for(ir, user, next_url=here) for ir in shown]),
        "closed_cards": [card_for(ir, user, next_url=here) for ir in closed],
        "result": present_result(task.result),
        "error": present_error(task.error),
        "arguments": pretty_json(task.arguments),
        "facts": facts(task),
        "timeline": entries,
        "timeline_earlier": earlier,
    }
