"""Tasks of the 2025-11-25 revision (SEP-1686), read into the same TaskSnapshot the Tasks extension's are.

A 2025-11-25 server that declares `capabilities.tasks.requests.tools.call` runs a tool whose `execution.taskSupport`
is "optional" or "required" as a task when the `tools/call` carries `task: {}`: it answers `{"task": Task}` at once,
then `tasks/get` says the task's status (no result, no questions), `tasks/result` blocks until the task ends and
answers with the call's own result (a `CallToolResult`, or the JSON-RPC error the call would have had), and the
questions of an `input_required` task arrive as server→client requests (`elicitation/create`, …) while a
`tasks/result` is open, related to the task by `_meta["io.modelcontextprotocol/related-task"]`.

Unlike the Tasks extension's, such a task lives on the session that created it (the reference server keeps one task
store per session, dropped with it): it is followed on that session by the worker that launched it
(taskhub/worker/session_tasks.py), never by the tracker's pollers. What differs between revisions stays here and in
`TasksClient`; the engine sees snapshots as it does for the extension.
"""

from __future__ import annotations

from typing import Any, Final

from taskhub.mcp import wire
from taskhub.mcp.errors import InvalidResult

VERSION: Final = "2025-11-25"
AUGMENTABLE: Final = frozenset({"optional", "required"})
# A task's `tasks/result` is open this long at most when the task names no ttl (its ttl bounds it otherwise).
DEFAULT_RESULT_WAIT_SECONDS: Final = 24 * 3600.0


def server_runs_tool_calls_as_tasks(capabilities: dict[str, Any]) -> bool:
    tasks = capabilities.get("tasks")
    requests = tasks.get("requests") if isinstance(tasks, dict) else None
    tools = requests.get("tools") if isinstance(requests, dict) else None
    return isinstance(tools, dict) and isinstance(tools.get("call"), dict)


def task_support(tool: Any) -> str | None:
    """A listed tool's `execution.taskSupport` ("forbidden" when absent, as the spec reads it)."""
    execution = tool.get("execution") if isinstance(tool, dict) else None
    support = execution.get("taskSupport") if isinstance(execution, dict) else None
    return support if isinstance(support, str) else "forbidden"


def is_task_handle(raw: dict[str, Any]) -> bool:
    """A `tools/call` answer that is a 2025-11-25 `CreateTaskResult` (`task`, and none of a result's keys)."""
    return isinstance(raw.get("task"), dict) and "content" not in raw and "resultType" not in raw


def snapshot_of(raw: Any, *, source: str) -> wire.TaskSnapshot:
    """A 2025-11-25 `Task` (from `tools/call`, `tasks/get`, `tasks/cancel` or `notifications/tasks/status`) as a
    snapshot without result or questions; `ttl` and `pollInterval` are milliseconds, as the extension's are."""
    if not isinstance(raw, dict):
        raise InvalidResult(f"{source}: expected a task object, got {type(raw).__name__}")
    status = raw.get("status")
    if not isinstance(status, str) or status not in wire.TASK_STATUSES:
        raise InvalidResult(f"{source}: unknown task status {str(status)[:80]!r}")
    task_id = raw.get("taskId")
    if not isinstance(task_id, str) or not task_id or len(task_id) > wire.MAX_TASK_ID_CHARS:
        raise InvalidResult(f"{source}: the task has no usable taskId")
    message = raw.get("statusMessage")
    return wire.TaskSnapshot(
        task_id=task_id,
        status=status,
        status_message=message if isinstance(message, str) else None,
        created_at=_timestamp(raw.get("createdAt")),
        last_updated_at=_timestamp(raw.get("lastUpdatedAt")),
        ttl_ms=raw.get("ttl"),
        poll_interval_ms=raw.get("pollInterval"),
    )


def _timestamp(value: Any) -> str | None:
    return value if isinstance(value, str) and len(value) <= wire.MAX_TIMESTAMP_CHARS else None


def final_snapshot(
    status: wire.TaskSnapshot, *, result: dict[str, Any] | None = None, error: dict[str, Any] | None = None
) -> wire.TaskSnapshot:
    """The task's end as the extension states it, from what `tasks/result` answered (`result`: the call's
    `CallToolResult`; `error`: the JSON-RPC error it answered with) and the last status `tasks/get` gave.

    A result is the call's result whatever the status says (a server that stores a result marks the task
    completed, a tool's own failure being `isError` in it); an error is the task's failure, or its cancellation when
    the server says it was cancelled."""
    if result is not None:
        cleaned = {key: value for key, value in result.items() if key not in ("resultType", "_meta", "task")}
        cleaned.setdefault("isError", False)
        return status.model_copy(update={"status": "completed", "result": cleaned, "error": None})
    if status.status == "cancelled":
        return status.model_copy(update={"result": None, "error": None})
    failure = error or {"code": -32603, "message": "the task failed"}
    return status.model_copy(update={"status": "failed", "result": None, "error": failure})
