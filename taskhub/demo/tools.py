"""The demo's tools: plain synchronous ones, and task tools whose signatures declare their arguments.

Task tools are executed by `TasksExtension.intercept_tool_call` (as a task, or inline for a client without
the extension); their Python bodies never run. The signatures give `tools/list` its input schemas and the
interceptor its argument validation, through the SDK's own `Tool.from_function`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from taskhub.demo.scripts import Question, name_question
from taskhub.demo.wire import MAX_TEXT_LENGTH

ShortText = Annotated[str, Field(max_length=MAX_TEXT_LENGTH)]
Label = Annotated[str, Field(max_length=200)]


@dataclass(frozen=True)
class PreTaskQuestion:
    """A question asked through MRTR (`resultType: "input_required"`) before the task is created."""

    key: str
    question: Question
    answer_field: str  # the content field copied into the task's arguments


@dataclass(frozen=True)
class TaskTool:
    tool: Tool
    sync_capable: bool = False  # may run inline for a client without the extension
    input_modes: frozenset[str] = frozenset()  # elicitation modes the client must declare
    pre_task: PreTaskQuestion | None = None

    @property
    def name(self) -> str:
        return self.tool.name

    def validate(self, arguments: dict[str, Any] | None) -> dict[str, Any]:
        """The arguments checked and defaulted per the signature; raises pydantic.ValidationError."""
        return self.tool.fn_metadata.validate_arguments(arguments or {})


def _served_by_interceptor() -> NoReturn:
    raise RuntimeError("task tools are executed by TasksExtension.intercept_tool_call")


# --- synchronous tools ----------------------------------------------------------------------------------------


def quick(text: ShortText) -> CallToolResult:
    """Echo the text back at once (never a task)."""
    return CallToolResult(content=[TextContent(type="text", text=f"echo: {text}")])


def greet(name: Label) -> CallToolResult:
    """Say hello (conformance fixture; synchronous only)."""
    return CallToolResult(content=[TextContent(type="text", text=f"Hello, {name}!")])


# --- task tools -----------------------------------------------------------------------------------------------


def progress(
    steps: Annotated[int, Field(ge=1, le=1000)] = 5, step_ms: Annotated[int, Field(ge=10, le=600_000)] = 400
) -> None:
    """Work through `steps` steps of `step_ms` each, reporting "step i of n"."""
    _served_by_interceptor()


def approval(action: Label = "deploy") -> None:
    """Ask a human to approve `action`, then report the decision."""
    _served_by_interceptor()


def two_questions() -> None:
    """Ask for a name and a color at once; partial answers are fine."""
    _served_by_interceptor()


def url_consent() -> None:
    """Ask the user to open an authorization URL (URL-mode elicitation)."""
    _served_by_interceptor()


def fail() -> None:
    """End as a failed task (a JSON-RPC error inside the task)."""
    _served_by_interceptor()


def tool_error() -> None:
    """Complete with a tool error result (isError: true)."""
    _served_by_interceptor()


def long(seconds: Annotated[float, Field(gt=0, le=86_400)] = 30) -> None:
    """Run for `seconds`, reporting elapsed time; honours tasks/cancel."""
    _served_by_interceptor()


def mrtr() -> None:
    """Ask for a name before the task starts (multi-round-trip), then greet in a task."""
    _served_by_interceptor()


def slow_compute(seconds: Annotated[float, Field(ge=0, le=86_400)] = 1, label: Label = "job") -> None:
    """Conformance fixture: compute for `seconds`, then return a result; ends cancelled when cancelled."""
    _served_by_interceptor()


def failing_job() -> None:
    """Conformance fixture: a task that completes with a tool error (task required)."""
    _served_by_interceptor()


def protocol_error_job() -> None:
    """Conformance fixture: a task that fails with a protocol error."""
    _served_by_interceptor()


def confirm_delete(filename: Label = "file.txt") -> None:
    """Conformance fixture: ask for confirmation, then delete (pretend)."""
    _served_by_interceptor()


def multi_input() -> None:
    """Conformance fixture: ask two questions in parallel."""
    _served_by_interceptor()


def test_tool_with_task() -> None:
    """Conformance fixture: ask for a user name (multi-round-trip), then finish in a task."""
    _served_by_interceptor()


def markup_probe(
    text: Annotated[
        str, Field(max_length=200, title='Text <img src=x onerror="window.__taskhub_xss=4">')
    ] = "<script>window.__taskhub_xss=5</script>",
) -> None:
    """Hostile fixture <img src=x onerror="window.__taskhub_xss=6">: every text it sends is markup to show literally."""
    _served_by_interceptor()


FORM = frozenset({"form"})


def _task_tool(fn: Callable[..., Any], **options: Any) -> TaskTool:
    return TaskTool(Tool.from_function(fn), **options)


def contract_tools() -> tuple[list[Tool], list[TaskTool]]:
    task_tools = [
        _task_tool(progress, sync_capable=True),
        _task_tool(approval, input_modes=FORM),
        _task_tool(two_questions, input_modes=FORM),
        _task_tool(url_consent, input_modes=frozenset({"url"})),
        _task_tool(fail, sync_capable=True),
        _task_tool(tool_error, sync_capable=True),
        _task_tool(long),
        _task_tool(
            mrtr, input_modes=FORM, pre_task=PreTaskQuestion("name", name_question("What is your name?"), "name")
        ),
    ]
    return [Tool.from_function(quick)], task_tools


def hostile_tools() -> tuple[list[Tool], list[TaskTool]]:
    return [], [_task_tool(markup_probe, input_modes=FORM)]


def conformance_tools() -> tuple[list[Tool], list[TaskTool]]:
    user_name = PreTaskQuestion("user_name", name_question("What is your user name?"), "name")
    task_tools = [
        _task_tool(slow_compute, sync_capable=True),
        _task_tool(failing_job),
        _task_tool(protocol_error_job),
        _task_tool(confirm_delete, input_modes=FORM),
        _task_tool(multi_input, input_modes=FORM),
        _task_tool(test_tool_with_task, input_modes=FORM, pre_task=user_name),
    ]
    return [Tool.from_function(greet)], task_tools
