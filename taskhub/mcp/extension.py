"""The Tasks extension on the `mcp` SDK's client hooks: requests, the task claim, the notification binding.

Passing :class:`TasksClientExtension` to `mcp.Client(extensions=[...])` makes every request declare
`io.modelcontextprotocol/tasks` in its `_meta` client capabilities, lets `tools/call` answer with a
task handle (`ResultClaim`), and routes `notifications/tasks` to open subscriptions (and a 2025-11-25 server's
`notifications/tasks/status` to the follower of the task it names). A plain SDK user
also gets the usual behaviour from `Client.call_tool`: the claim's resolver polls the task to its end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import mcp_types
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from taskhub.mcp import wire
from taskhub.mcp.errors import McpClientError
from taskhub.mcp.session_tasks import STATUS_NOTIFICATION, StatusNotices
from taskhub.mcp.wire import CreateTaskResult

if TYPE_CHECKING:
    from taskhub.mcp.client import TaskSubscription

logger = logging.getLogger(__name__)

_RAW = TypeAdapter(dict[str, Any])


class TaskIdParams(mcp_types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTaskRequest(mcp_types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTaskRequest(mcp_types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTaskRequest(mcp_types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class TaskNotificationParams(mcp_types.NotificationParams):
    """`notifications/tasks` params: a full `DetailedTask` plus `_meta`; every task field is kept as sent."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    meta: dict[str, Any] | None = Field(alias="_meta", default=None)


async def decline_elicitation(_context: Any, _params: Any) -> mcp_types.ElicitResult:
    """Registering a callback is what makes the SDK declare form and URL elicitation.

    On 2026-07-28 input reaches us inside results (MRTR, `inputRequests`), never as a server request;
    should an old server send one anyway, nobody is there to answer it here.
    """
    return mcp_types.ElicitResult(action="decline")


async def resolve_task_to_result(created: CreateTaskResult, context: ClaimContext) -> mcp_types.CallToolResult:
    """For `Client.call_tool` users: follow the task to its end, honouring `pollIntervalMs`."""
    snapshot = created.to_snapshot()
    while not snapshot.is_terminal:
        if snapshot.status == "input_required":
            raise MCPError(
                mcp_types.INTERNAL_ERROR, f"task {snapshot.task_id} needs input; use TasksClient to answer it"
            )
        await asyncio.sleep((snapshot.poll_interval_ms or 1000) / 1000)
        raw = await context.session.send_request(
            GetTaskRequest(params=TaskIdParams(task_id=snapshot.task_id)),
            _RAW,
            request_read_timeout_seconds=context.read_timeout_seconds,
        )
        snapshot = wire.parse_get_task_result(raw)
    if snapshot.status == "completed":
        return mcp_types.CallToolResult.model_validate(snapshot.tool_result or {"content": []})
    if snapshot.status == "failed":
        error = snapshot.error or {}
        raise MCPError(int(error.get("code", mcp_types.INTERNAL_ERROR)), str(error.get("message", "task failed")))
    raise MCPError(mcp_types.INTERNAL_ERROR, f"task {snapshot.task_id} was cancelled")


class TasksClientExtension(ClientExtension):
    identifier = wire.EXTENSION_ID

    def __init__(self) -> None:
        self.routes: dict[str, TaskSubscription] = {}
        # 2025-11-25 tasks followed on this client's session, by task id (taskhub.mcp.session_tasks).
        self.session_task_notices: dict[str, StatusNotices] = {}

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreateTaskResult, resolve=resolve_task_to_result),)

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return (
            NotificationBinding(
                method="notifications/tasks", params_type=TaskNotificationParams, handler=self._on_task
            ),
            # 2025-11-25's `notifications/tasks/status` (the SDK's core tables leave it to bindings at that version).
            NotificationBinding(
                method=STATUS_NOTIFICATION, params_type=TaskNotificationParams, handler=self._on_session_task_status
            ),
        )

    async def _on_session_task_status(self, params: TaskNotificationParams) -> None:
        raw = dict(params.model_extra or {})
        notices = self.session_task_notices.get(raw.get("taskId"))  # type: ignore[arg-type]
        if notices is not None:
            notices.offer(raw)

    async def _on_task(self, params: TaskNotificationParams) -> None:
        subscription_id = (params.meta or {}).get(wire.SUBSCRIPTION_ID_META_KEY)
        subscription = self.routes.get(subscription_id) if isinstance(subscription_id, str) else None
        if subscription is None:
            logger.info("ignored a notifications/tasks for no open subscription (%.80r)", subscription_id)
            return
        raw = dict(params.model_extra or {})
        try:
            snapshot = wire.parse_task_snapshot(raw, source="notifications/tasks")
        except (McpClientError, ValidationError) as error:
            # Not stored; polling remains the source of truth. The subscriber hears of it when it names a task.
            problem = wire.first_error(error) if isinstance(error, ValidationError) else str(error)
            subscription._problem(raw.get("taskId"), problem)
            return
        subscription._deliver(snapshot)
