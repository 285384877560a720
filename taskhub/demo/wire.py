"""Wire constants and small helpers of the MCP Tasks extension, as the demo server speaks it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import HEADER_MISMATCH, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
SUBSCRIPTION_ID_META_KEY = "io.modelcontextprotocol/subscriptionId"

WORKING = "working"
INPUT_REQUIRED = "input_required"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
TERMINAL_STATUSES = frozenset({COMPLETED, FAILED, CANCELLED})

# Bounds applied to everything a client sends us.
MAX_ID_LENGTH = 200
MAX_KEYS_PER_UPDATE = 64
MAX_TASK_IDS_PER_LISTEN = 256
MAX_TEXT_LENGTH = 2000


def iso_time(timestamp: float) -> str:
    """Seconds since the epoch as an ISO 8601 UTC string with milliseconds, e.g. 2026-01-02T03:04:05.678Z."""
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def text_result(text: str, *, is_error: bool = False) -> dict[str, Any]:
    """A CallToolResult with one text block, as a wire dict."""
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def sync_result(text: str, *, is_error: bool = False) -> dict[str, Any]:
    """A complete `tools/call` result (CallToolResult with `resultType`)."""
    return {"resultType": "complete", **text_result(text, is_error=is_error)}


def invalid_params(message: str) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=message)


def header_mismatch(message: str) -> MCPError:
    return MCPError(code=HEADER_MISMATCH, message=message)


def missing_capability(required: dict[str, Any]) -> MCPError:
    """-32021 naming what the client must declare, e.g. {"extensions": {TASKS_EXTENSION: {}}}."""
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message="Missing required client capability",
        data={"requiredCapabilities": required},
    )


def missing_tasks_extension() -> MCPError:
    return missing_capability({"extensions": {TASKS_EXTENSION: {}}})


def bounded(text: str, limit: int = MAX_TEXT_LENGTH) -> str:
    """Cut client-supplied text we echo back so no response grows without bound."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
