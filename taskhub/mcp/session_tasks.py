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
`TasksClient`; the engine sees snapshots as it does for the extension. `SessionTaskFollower` is the one loop that
follows such a task, for the worker (taskhub/worker/session_tasks.py) and the CLI alike: `tasks/result` open
throughout, the status from `notifications/tasks/status` when the server sends it, else `tasks/get` at the task's
poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Final

from taskhub.mcp import wire
from taskhub.mcp.errors import InvalidResult, McpClientError, ProtocolError

if TYPE_CHECKING:
    from mcp.shared.dispatcher import ProgressFnT

    from taskhub.mcp.client import TasksClient
    from taskhub.mcp.questions import Asker, LogSink

logger = logging.getLogger(__name__)

VERSION: Final = "2025-11-25"
AUGMENTABLE: Final = frozenset({"optional", "required"})
# A task's `tasks/result` is open this long at most when the task names no ttl (its ttl bounds it otherwise).
DEFAULT_RESULT_WAIT_SECONDS: Final = 24 * 3600.0
STATUS_NOTIFICATION: Final = "notifications/tasks/status"


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


class StatusNotices:
    """What `notifications/tasks/status` said of one task since its follower last looked: the newest only."""

    def __init__(self) -> None:
        self._latest: wire.TaskSnapshot | None = None
        self.arrived = asyncio.Event()

    def offer(self, raw: dict[str, Any]) -> None:
        try:
            snapshot = snapshot_of(raw, source=STATUS_NOTIFICATION)
        except InvalidResult as error:  # not stored: tasks/get stays the source of truth
            logger.info("ignored a %s: %s", STATUS_NOTIFICATION, error)
            return
        self._latest = snapshot
        self.arrived.set()

    def take(self) -> wire.TaskSnapshot | None:
        latest, self._latest = self._latest, None
        self.arrived.clear()
        return latest


class SessionTaskFollower:
    """A 2025-11-25 task followed to its end on the session that created it.

    One `tasks/result` is open throughout (its answer is the task's end; the task's questions and log lines arrive
    while it is open and go to `asker` and `on_log`). Between, the task's status comes from the server's
    `notifications/tasks/status` when it sends one, else from `tasks/get` once `next_look_s` has passed. `run()`
    returns the end as the extension states it (`final_snapshot`); a broken session or a `tasks/result` that outlived
    the task's ttl raises (McpClientError, RequestTimeout). What a follower does with what it sees is its own:
    override `seen`, `cancel_due`, `cancel_sent` and `cancel_refused`.
    """

    # Whether a `tasks/get` the server refuses (a JSON-RPC error, the session alive) is let pass: the next look asks
    # again. When False it ends the following (raised).
    tolerate_refused_reads = True

    def __init__(
        self,
        client: TasksClient,
        created: wire.TaskSnapshot,
        *,
        asker: Asker,
        on_log: LogSink | None = None,
        on_progress: ProgressFnT | None = None,
        progress_token: str | None = None,
    ) -> None:
        self.client = client
        self.created = created
        self.asker = asker
        self.on_log = on_log
        # The server's progress on the task, sent with the progress token of the call that made it.
        self.on_progress = on_progress
        self.progress_token = progress_token

    def next_look_s(self, last: wire.TaskSnapshot) -> float:
        """Seconds until the next `tasks/get`: the server's hint, within the bounds the tracker keeps it in."""
        return wire.bounded_poll_interval_ms(last.poll_interval_ms) / 1000

    async def seen(self, snapshot: wire.TaskSnapshot, source: str) -> None:
        """A status of the task that is not its end (from `tasks/get` or `notifications/tasks/status`)."""

    async def cancel_due(self) -> bool:
        """Whether to send `tasks/cancel` now (asked before each look until a cancel was sent or refused)."""
        return False

    async def cancel_sent(self, answered: wire.TaskSnapshot) -> None:
        """The server took the cancel; the task is followed on to its end."""

    async def cancel_refused(self, error: ProtocolError) -> None:
        """The server refused the cancel (it ended meanwhile, say); it is not sent again."""
        raise error

    async def run(self) -> wire.TaskSnapshot:
        remote = self.created.task_id
        wait = self.created.ttl_ms / 1000 if self.created.ttl_ms else DEFAULT_RESULT_WAIT_SECONDS
        ending = asyncio.ensure_future(
            self.client.session_task_result(remote, wait_seconds=wait, asker=self.asker, on_log=self.on_log)
        )
        last = self.created
        cancel_tried = False
        try:
            with (
                self.client.session_task_statuses(remote) as notices,
                self.client.session_task_progress(self.progress_token, self.on_progress),
            ):
                while not ending.done():
                    notified = asyncio.ensure_future(notices.arrived.wait())
                    try:
                        await asyncio.wait({ending, notified}, timeout=self.next_look_s(last))
                    finally:
                        notified.cancel()
                    if ending.done():
                        break
                    if not cancel_tried and await self.cancel_due():
                        cancel_tried = True
                        try:
                            last = await self.client.cancel_session_task(remote)
                        except ProtocolError as error:
                            await self.cancel_refused(error)
                        else:
                            await self.cancel_sent(last)
                        continue
                    status, source = notices.take(), STATUS_NOTIFICATION
                    if status is None:
                        try:
                            status, source = await self.client.get_session_task(remote), "tasks/get"
                        except ProtocolError as error:
                            if not self.tolerate_refused_reads:
                                raise
                            logger.warning("tasks/get of task %s (2025-11-25) refused: %s", remote[:80], error)
                            continue
                    last = status
                    if not status.is_terminal:  # its end is what tasks/result answers, which it does now
                        await self.seen(status, source)
            status = await self._status_at_end(last)
            try:
                return final_snapshot(status, result=await ending)
            except ProtocolError as error:
                return final_snapshot(status, error=error.to_error_object())
        finally:
            if not ending.done():
                ending.cancel()
            with contextlib.suppress(BaseException):  # its failure, if the session broke under both, is said above
                await ending

    async def _status_at_end(self, last: wire.TaskSnapshot) -> wire.TaskSnapshot:
        """The task's status once tasks/result answered (the server settles it first); the last one seen if it
        cannot be read."""
        if last.is_terminal:
            return last
        try:
            return await self.client.get_session_task(last.task_id)
        except McpClientError:  # the end is tasks/result's; the status only says how it ended
            return last
