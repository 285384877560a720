"""A server's stored tool catalogue (`Server.tools`, as `tools/list` sent it: untrusted) read safely for pages.

Whatever shape the server sent, `tools_of` returns only entries with a string name, and every text is a
plain string (templates escape it). `find_tool` is how the launch page decides what may be launched: only
a tool in the stored catalogue, and not one whose `x-mcp-header` annotations are invalid (`header_problem`, SEP-2243:
a client must not call it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.utils.translation import gettext_lazy

from taskhub.mcp.secret_urls import mask_url
from taskhub.mcp.tool_headers import header_problem
from taskhub.servers.models import Server, Transport

MAX_TOOLS = 1000
MAX_DESCRIPTION = 4000
MAX_SCHEMA_SHOWN = 100_000

# Hints of the MCP tool annotations, shown as small labels when the server set them.
HINT_LABELS = (
    ("readOnlyHint", True, gettext_lazy("read-only"), "safe"),
    ("destructiveHint", True, gettext_lazy("destructive"), "danger"),
    ("destructiveHint", False, gettext_lazy("not destructive"), "safe"),
    ("idempotentHint", True, gettext_lazy("idempotent"), ""),
    ("openWorldHint", True, gettext_lazy("open world"), ""),
    ("openWorldHint", False, gettext_lazy("closed world"), ""),
)
TASK_SUPPORT_WORDS = {
    "required": gettext_lazy("always runs as a task"),
    "optional": gettext_lazy("may run as a task"),
    "forbidden": gettext_lazy("never runs as a task"),
}


@dataclass
class Label:
    text: str
    kind: str = ""


@dataclass
class ToolEntry:
    name: str
    title: str
    description: str
    labels: list[Label] = field(default_factory=list)
    task_support: str = ""
    input_schema: Any = None
    header_problem: str = ""
    """Why the tool must not be called (invalid `x-mcp-header` annotations), "" when it may."""

    @property
    def schema_json(self) -> str:
        return pretty_json(self.input_schema, limit=MAX_SCHEMA_SHOWN)


def pretty_json(value: Any, *, limit: int = MAX_SCHEMA_SHOWN) -> str:
    try:
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return "(not representable as JSON)"
    return text if len(text) <= limit else text[:limit] + "\n… (cut)"


def _str(value: Any, limit: int = 500) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _entry(raw: dict[str, Any]) -> ToolEntry:
    annotations = raw.get("annotations") if isinstance(raw.get("annotations"), dict) else {}
    labels = [Label(text, kind) for key, value, text, kind in HINT_LABELS if annotations.get(key) is value]
    execution = raw.get("execution") if isinstance(raw.get("execution"), dict) else {}
    support = execution.get("taskSupport")
    problem = header_problem(raw.get("inputSchema")) or ""
    if problem:
        labels.insert(0, Label("cannot be called: invalid x-mcp-header", "danger"))
    return ToolEntry(
        name=raw["name"],
        title=_str(raw.get("title")) or _str(annotations.get("title")),
        description=_str(raw.get("description"), MAX_DESCRIPTION),
        labels=labels,
        task_support=TASK_SUPPORT_WORDS.get(support, "") if isinstance(support, str) else "",
        input_schema=raw.get("inputSchema"),
        header_problem=problem,
    )


def tools_of(server: Server) -> list[ToolEntry]:
    raw_tools = server.tools if isinstance(server.tools, list) else []
    return [
        _entry(raw)
        for raw in raw_tools[:MAX_TOOLS]
        if isinstance(raw, dict) and isinstance(raw.get("name"), str) and raw["name"]
    ]


def find_tool(server: Server, name: str) -> ToolEntry | None:
    """The first of tools_of(server) named `name`, made alone: not an entry for every tool (each one's schema walked
    for its header annotations) to keep one, on every launch."""
    raw_tools = server.tools if isinstance(server.tools, list) else []
    for raw in raw_tools[:MAX_TOOLS]:
        if isinstance(raw, dict) and isinstance(raw.get("name"), str) and raw["name"] and raw["name"] == name:
            return _entry(raw)
    return None


def endpoint_of(server: Server) -> str:
    """Where the server is, for display: the URL with its secrets masked, or the command line."""
    if server.transport == Transport.HTTP:
        return mask_url(server.url)
    args = server.args if isinstance(server.args, list) else []
    return " ".join([server.command, *(str(arg) for arg in args)])


def health_of(server: Server) -> str:
    """reachable / unreachable / never (contacted): the health dot of the servers pages."""
    if server.unreachable_since is not None:
        return "unreachable"
    if server.last_success_at is not None:
        return "reachable"
    return "never"
