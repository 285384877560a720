"""Wire shapes of the MCP Tasks extension (`io.modelcontextprotocol/tasks`, protocol 2026-07-28).

The models are tolerant readers: unknown fields are kept (``extra="allow"``), optional fields may be
absent, and a peer that is sloppy in harmless ways is accepted. What the spec says a client MUST
reject (an unknown ``resultType``, an unknown task status, a task result to anything but
``tools/call``) raises :class:`~taskhub.mcp.errors.InvalidResult`.

The request helpers at the bottom build ``_meta`` and HTTP headers exactly as the SDK stamps them,
so a lean HTTP path (the tracker's ``tasks/get``) can send byte-for-byte the same request.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Final, Literal

import mcp_types
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from taskhub.mcp.errors import InvalidResult

PROTOCOL_VERSION: Final = "2026-07-28"
EXTENSION_ID: Final = "io.modelcontextprotocol/tasks"

PROTOCOL_VERSION_META_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO_META_KEY: Final = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES_META_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
SUBSCRIPTION_ID_META_KEY: Final = "io.modelcontextprotocol/subscriptionId"

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TASK_STATUSES: Final[frozenset[str]] = frozenset({"working", "input_required", "completed", "failed", "cancelled"})
TERMINAL_STATUSES: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled"})
CORE_RESULT_TYPES: Final[frozenset[str]] = frozenset({"complete", "input_required"})

# Longer than any sane peer sends, and what taskhub's columns hold: past these a task is malformed.
MAX_TASK_ID_CHARS: Final = 500
MAX_INPUT_KEY_CHARS: Final = 500
MAX_METHOD_CHARS: Final = 100
MAX_TIMESTAMP_CHARS: Final = 64
# The most taskhub reads of one JSON answer (HTTP); a larger one is refused, unparsed.
MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024

# How often a task is polled: the server's `pollIntervalMs` kept within these bounds (a hint of 1 ms would be a busy
# loop, one of 10^12 ms a task never looked at again), and the interval when it gives none.
DEFAULT_POLL_INTERVAL_MS: Final = 1000
MIN_POLL_INTERVAL_MS: Final = 250
MAX_POLL_INTERVAL_MS: Final = 60_000


def bounded_poll_interval_ms(
    hint_ms: int | None, *, floor_ms: int = MIN_POLL_INTERVAL_MS, cap_ms: int = MAX_POLL_INTERVAL_MS
) -> int:
    """A task's poll interval hint (`pollIntervalMs`, or a 2025-11-25 task's `pollInterval`) kept between a floor and
    a cap: a server cannot make its clients poll in a tight loop or never."""
    return min(max(hint_ms or DEFAULT_POLL_INTERVAL_MS, floor_ms), cap_ms)


# What every request of ours declares: form and URL elicitation, and the extension.
CLIENT_CAPABILITIES: Final[dict[str, Any]] = {
    "elicitation": {"form": {}, "url": {}},
    "extensions": {EXTENSION_ID: {}},
}


class WireModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class TaskSnapshot(WireModel):
    """One `DetailedTask`: what `tasks/get` returns and `notifications/tasks` carries (minus envelope)."""

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    input_requests: dict[str, dict[str, Any]] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @field_validator("ttl_ms", "poll_interval_ms", mode="before")
    @classmethod
    def _whole_positive_ms(cls, value: Any) -> Any:
        # Sloppy peers send floats or non-positive numbers; a bad hint is dropped, never fatal.
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or value <= 0:
            return None
        return value

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def tool_result(self) -> dict[str, Any] | None:
        """The final `CallToolResult` without the envelope keys some peers copy into it."""
        if self.result is None:
            return None
        return {key: value for key, value in self.result.items() if key not in ("resultType", "_meta")}

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


def parse_task_snapshot(raw: Any, *, source: str) -> TaskSnapshot:
    """Validate a `DetailedTask` from `tasks/get` or `notifications/tasks`."""
    if not isinstance(raw, dict):
        raise InvalidResult(f"{source}: expected an object, got {type(raw).__name__}")
    status = raw.get("status")
    if not isinstance(status, str) or status not in TASK_STATUSES:
        raise InvalidResult(f"{source}: unknown task status {_short(status)}")
    try:
        snapshot = TaskSnapshot.model_validate(raw)
    except ValidationError as error:
        raise InvalidResult(f"{source}: malformed task: {first_error(error)}") from error
    _check_identifiers(snapshot, source=source)
    if snapshot.status == "input_required" and snapshot.input_requests is None:
        raise InvalidResult(f"{source}: status input_required without inputRequests")
    if snapshot.status == "completed" and snapshot.result is None and source != "tools/call":
        # Shown as an empty success otherwise. (A task handle from tools/call carries no result: tasks/get has it.)
        raise InvalidResult(f"{source}: status completed without result")
    if snapshot.status == "failed" and snapshot.error is None:
        # A failed task without its error is still failed; keep what we know rather than reject it.
        snapshot.error = {
            "code": -32603,
            "message": snapshot.status_message or "Task failed (the server sent no error)",
        }
    return snapshot


def _exact_text(value: str) -> bool:
    """Whether `value` can be stored and sent back exactly: no NUL (Postgres refuses it), no lone surrogate."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def _check_identifiers(snapshot: TaskSnapshot, *, source: str) -> None:
    """Identifiers taskhub must store and send back exactly: of bounded length and plain characters."""
    problem = None
    if len(snapshot.task_id) > MAX_TASK_ID_CHARS:
        problem = f"taskId is longer than {MAX_TASK_ID_CHARS} characters"
    if not _exact_text(snapshot.task_id) or not all(_exact_text(key) for key in snapshot.input_requests or {}):
        problem = "a taskId or inputRequests key holds a NUL character or a lone surrogate"
    for name, value in (("createdAt", snapshot.created_at), ("lastUpdatedAt", snapshot.last_updated_at)):
        if value is not None and len(value) > MAX_TIMESTAMP_CHARS:
            problem = f"{name} is longer than {MAX_TIMESTAMP_CHARS} characters"
    for key, request in (snapshot.input_requests or {}).items():
        if len(key) > MAX_INPUT_KEY_CHARS:
            problem = f"an inputRequests key is longer than {MAX_INPUT_KEY_CHARS} characters"
        method = request.get("method")
        if method is not None and (not isinstance(method, str) or len(method) > MAX_METHOD_CHARS):
            problem = f"inputRequests.{_short(key, 40)}.method is not a name of at most {MAX_METHOD_CHARS} characters"
    if problem is not None:
        raise InvalidResult(f"{source}: malformed task: {problem}")


def parse_get_task_result(raw: Any) -> TaskSnapshot:
    """`tasks/get` answers `resultType: "complete"` (absent means complete); a task handle here is invalid."""
    result_type = _result_type(raw, method="tasks/get")
    if result_type != "complete":
        raise InvalidResult(f"tasks/get: resultType {result_type!r} is not valid here")
    return parse_task_snapshot(raw, source="tasks/get")


def parse_ack(raw: Any, *, method: str) -> None:
    """`tasks/update` and `tasks/cancel` answer an empty acknowledgement."""
    result_type = _result_type(raw, method=method)
    if result_type != "complete":
        raise InvalidResult(f"{method}: resultType {result_type!r} is not valid here")


def _result_type(raw: Any, *, method: str) -> str:
    if not isinstance(raw, dict):
        raise InvalidResult(f"{method}: expected an object, got {type(raw).__name__}")
    result_type = raw.get("resultType", "complete")
    if result_type == "task":
        raise InvalidResult(f"{method}: a task handle (resultType 'task') is valid only for tools/call")
    if not isinstance(result_type, str) or result_type not in CORE_RESULT_TYPES:
        raise InvalidResult(f"{method}: unknown resultType {_short(result_type)}")
    return result_type


class CreateTaskResult(mcp_types.Result):
    """The flat `CreateTaskResult` (`Result & Task & {resultType: "task"}`), the SDK claim model for `tools/call`."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: Any = None
    poll_interval_ms: Any = None

    def to_snapshot(self) -> TaskSnapshot:
        raw = self.model_dump(by_alias=True, mode="json", exclude_none=True)
        raw.pop("resultType", None)
        raw.pop("_meta", None)
        return parse_task_snapshot(raw, source="tools/call")


# --- requests -----------------------------------------------------------------------------------


def request_meta(*, client_info: dict[str, Any]) -> dict[str, Any]:
    """The `_meta` every 2026-07-28 request of ours carries (as the SDK's modern stamp writes it)."""
    return {
        PROTOCOL_VERSION_META_KEY: PROTOCOL_VERSION,
        CLIENT_INFO_META_KEY: client_info,
        CLIENT_CAPABILITIES_META_KEY: CLIENT_CAPABILITIES,
    }


_HEADER_SAFE = re.compile(r"^[\x20-\x7E]*$")


def encode_header_value(value: str) -> str:
    """Header-safe values pass as they are; anything else as `=?base64?…?=` (core SEP-2243)."""
    if _HEADER_SAFE.match(value) and value == value.strip():
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


def task_request_headers(*, method: str, task_id: str) -> dict[str, str]:
    """HTTP headers of a `tasks/*` request: version, `Mcp-Method`, and `Mcp-Name` = the task id."""
    return {
        "mcp-protocol-version": PROTOCOL_VERSION,
        "mcp-method": method,
        "mcp-name": encode_header_value(task_id),
    }


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "result"
    return f"{where}: {first['msg']}"
