"""The server side of the Tasks extension on the SDK's extension hooks.

`TasksExtension` serves `tasks/get`, `tasks/update` and `tasks/cancel` (MethodBindings) and turns calls of
task tools into tasks (`intercept_tool_call`). `tasks/result` and `tasks/list` stay unbound, so the SDK
answers them with -32601.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import CallToolRequestParams, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, ValidationError

from taskhub.demo.engine import NeedsInput, TaskEngine, TaskExpired, TaskNotFound
from taskhub.demo.scripts import Phase
from taskhub.demo.stats import DemoStats
from taskhub.demo.tools import TaskTool
from taskhub.demo.wire import (
    FAILED,
    MAX_ID_LENGTH,
    MAX_KEYS_PER_UPDATE,
    TASKS_EXTENSION,
    bounded,
    header_mismatch,
    invalid_params,
    missing_capability,
    missing_tasks_extension,
    sync_result,
)

TaskId = Annotated[str, Field(alias="taskId", min_length=1, max_length=MAX_ID_LENGTH)]
ResponseKey = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]


class TaskIdParams(RequestParams):
    task_id: TaskId


class UpdateTaskParams(TaskIdParams):
    input_responses: Annotated[
        dict[ResponseKey, dict[str, Any]], Field(alias="inputResponses", max_length=MAX_KEYS_PER_UPDATE)
    ]


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this very request declared the extension (never inferred from earlier requests)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False  # the extension does not exist on the handshake-era protocol
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions)


def require_input_modes(ctx: ServerRequestContext[Any, Any], modes: frozenset[str]) -> None:
    """-32021 unless the request declared elicitation in every mode the tool will ask in.

    `elicitation: {}` declares form mode only.
    """
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities else None
    form_ok = elicitation is not None and (elicitation.form is not None or elicitation.url is None)
    url_ok = elicitation is not None and elicitation.url is not None
    if "form" in modes and not form_ok:
        raise missing_capability({"elicitation": {"form": {}}})
    if "url" in modes and not url_ok:
        raise missing_capability({"elicitation": {"url": {}}})


def check_routing_header(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """On HTTP, `Mcp-Name` must carry `params.taskId` (the SDK checks `Mcp-Method` itself)."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return  # stdio has no headers
    if decode_header_value(headers.get(MCP_NAME_HEADER)) != task_id:
        raise header_mismatch("Mcp-Name header does not match params.taskId")


def phase_as_call_result(phase: Phase) -> dict[str, Any]:
    """What the synchronous call returns for a script's terminal phase."""
    if phase.status == FAILED and phase.error is not None:
        raise MCPError(code=phase.error["code"], message=phase.error["message"])
    if phase.result is not None:
        return {"resultType": "complete", **phase.result}
    return sync_result("cancelled", is_error=True)


class TasksExtension(Extension):
    identifier = TASKS_EXTENSION

    def __init__(
        self,
        engine: TaskEngine,
        task_tools: Sequence[TaskTool],
        stats: DemoStats,
        *,
        get_delay_ms: int = 0,
        update_delay_ms: int = 0,
    ) -> None:
        self._engine = engine
        self._tools = {tool.name: tool for tool in task_tools}
        self._stats = stats
        self._get_delay = get_delay_ms / 1000
        self._update_delay = update_delay_ms / 1000

    def methods(self) -> Sequence[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (
            MethodBinding("tasks/get", TaskIdParams, self._get, protocol_versions=versions),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, protocol_versions=versions),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel, protocol_versions=versions),
        )

    # --- tasks/* --------------------------------------------------------------------------------------------

    def _admit(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
        check_routing_header(ctx, task_id)
        require_client_extension(ctx, TASKS_EXTENSION)

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        self._admit(ctx, params.task_id)
        if not self._engine.exists(params.task_id):
            raise invalid_params("Failed to retrieve task: Task not found")
        with self._stats.polling(params.task_id):
            # A checkpoint (or the configured delay) inside the counted window makes overlapping polls visible.
            await anyio.sleep(self._get_delay)
            try:
                view = self._engine.get(params.task_id)
            except TaskNotFound:
                raise invalid_params("Failed to retrieve task: Task not found") from None
            except TaskExpired:
                raise invalid_params("Failed to retrieve task: Task has expired") from None
        return {"resultType": "complete", **view.to_wire()}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> dict[str, Any]:
        self._admit(ctx, params.task_id)
        self._stats.update_received(params.task_id)
        # Held before the answers are applied, and shielded: like a server that finishes what it received, the
        # answers land even when the client gives up on the request meanwhile.
        with anyio.CancelScope(shield=True):
            await anyio.sleep(self._update_delay)
            try:
                outcome = self._engine.update(params.task_id, params.input_responses)
            except (TaskNotFound, TaskExpired):
                raise invalid_params("Task not found") from None
            except ValueError as problem:
                raise invalid_params(bounded(str(problem), 500)) from None
            for key in outcome.issued:
                self._stats.delivered(params.task_id, key)
        return {"resultType": "complete"}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        self._admit(ctx, params.task_id)
        try:
            self._engine.cancel(params.task_id)
        except (TaskNotFound, TaskExpired):
            raise invalid_params("Task not found") from None
        self._stats.cancel_requested(params.task_id)
        return {"resultType": "complete"}

    # --- tools/call ---------------------------------------------------------------------------------------------

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        tool = self._tools.get(params.name)
        if tool is None:
            return await call_next(ctx)
        self._stats.called(tool.name)
        declared = declares_tasks(ctx)
        if not declared and not tool.sync_capable:
            raise missing_tasks_extension()
        try:
            args = tool.validate(params.arguments)
        except ValidationError as exc:
            fields = sorted({".".join(str(part) for part in err["loc"]) for err in exc.errors()})
            return sync_result(bounded(f"Invalid arguments for {tool.name}: {', '.join(fields)}", 500), is_error=True)
        if not declared:
            return await self._run_inline(tool, args)
        require_input_modes(ctx, tool.input_modes)
        if tool.pre_task is not None:
            return self._pre_task_round(tool, params, args)
        return self._engine.create(tool.name, args).create_task_result()

    async def _run_inline(self, tool: TaskTool, args: dict[str, Any]) -> dict[str, Any]:
        try:
            return phase_as_call_result(await self._engine.run_inline(tool.name, args))
        except NeedsInput:
            raise missing_tasks_extension() from None

    def _pre_task_round(self, tool: TaskTool, params: CallToolRequestParams, args: dict[str, Any]) -> dict[str, Any]:
        """MRTR before the task exists: ask until answered, then create the task from the answer."""
        assert tool.pre_task is not None
        pre_task = tool.pre_task
        response = _plain(params.input_responses or {}).get(pre_task.key)
        if response is None or params.request_state != tool.name:
            return {
                "resultType": "input_required",
                "inputRequests": {pre_task.key: pre_task.question.to_wire()},
                "requestState": tool.name,  # sealed by the SDK's RequestStateBoundary before it leaves
            }
        if (problem := pre_task.question.problem_with(response)) is not None:
            raise invalid_params(f"inputResponses[{pre_task.key!r}]: {problem}")
        if response.get("action") != "accept":
            return sync_result("declined")
        task_args = {**args, pre_task.answer_field: response["content"][pre_task.answer_field]}
        return self._engine.create(tool.name, task_args).create_task_result()


def _plain(responses: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Input responses as wire dicts, whether the SDK parsed them into models or not."""
    plain: dict[str, dict[str, Any]] = {}
    for key, value in responses.items():
        if isinstance(value, BaseModel):
            plain[key] = value.model_dump(by_alias=True, mode="json", exclude_none=True)
        elif isinstance(value, Mapping):
            plain[key] = dict(value)
    return plain
