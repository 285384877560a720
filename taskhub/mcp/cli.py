"""Command line front for :class:`~taskhub.mcp.client.TasksClient`.

``python -m taskhub.mcp call (--url URL | --stdio CMD) TOOL [...]`` calls a tool, answers MRTR and
task input requests, follows a task to its end and prints the result; ``discover`` prints what a
server says about itself. Everything the server sends is untrusted: human output is stripped of
control characters and escape sequences and long strings are capped; ``--json`` output is exact.

Exit status: 0 completed, 1 completed with ``isError``, 2 failed, 3 cancelled (or a cancel
the server did not confirm within ``--cancel-wait``), 4 protocol or
transport error (a tool the server describes with invalid ``x-mcp-header`` annotations, SEP-2243, is refused
with 4 before it is called), 5 bad arguments (or an input request nobody can answer), 141 the reader of its
output went away (`… | head`).

Over HTTP, ``call`` lists the server's tools first and mirrors the tool's ``x-mcp-header`` arguments into
``Mcp-Param-*`` headers (see :mod:`taskhub.mcp.tool_headers`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mcp_types import INTERNAL_ERROR

from taskhub.mcp import schema_fields, session_tasks, tool_headers, wire

# Exit statuses and the argument parser live in cli_args (standard library only: `--help` and bad arguments
# answer without importing the SDK); they are re-exported here for callers of this module.
from taskhub.mcp.cli_args import (
    DEFAULT_CANCEL_WAIT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    EXIT_BROKEN_PIPE,
    EXIT_CANCELLED,
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PROTOCOL_ERROR,
    EXIT_TOOL_ERROR,
    EXIT_USAGE,
    build_parser,
    oauth_requested,
)
from taskhub.mcp.client import (
    HttpTarget,
    OwnAnswers,
    ServerTarget,
    StdioTarget,
    TaskCreated,
    TasksClient,
    TaskSubscription,
    ToolCompleted,
    ToolInputRequired,
)
from taskhub.mcp.errors import AuthorizationFailed, InvalidResult, McpClientError, ProtocolError, RequestTimeout
from taskhub.mcp.questions import Question
from taskhub.mcp.wire import TaskSnapshot

# With --listen, notifications drive the loop; this poll only guards against a silent stream.
SAFETY_POLL_INTERVAL_S = 5.0
MAX_MRTR_ROUNDS = 10

LINE_CAP = 300
TEXT_CAP = 20_000
WILDCARD_KEY = "*"


class UsageError(Exception):
    """Bad arguments, or an input request no answer exists for: exit status 5."""


# --- untrusted text ---------------------------------------------------------------------------------

# CSI, OSC (BEL or ST terminated), DCS/SOS/PM/APC strings, and two-character escapes.
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
# C0/C1 controls and DEL, plus the bidi overrides that can make text read differently than it is.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean_text(value: Any, *, multiline: bool = False, cap: int | None = LINE_CAP) -> str:
    """Server text made safe for a terminal: no escape sequences or controls, capped in length."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = _ESCAPE_SEQUENCE.sub("", text)
    text = text.replace("\r\n", "\n")
    if not multiline:
        text = text.replace("\n", " ").replace("\t", " ")
    text = _CONTROL.sub("", text)
    if cap is not None and len(text) > cap:
        text = f"{text[:cap]}… [{len(text) - cap} more characters; see --json]"
    return text


def quoted(value: Any, *, cap: int = LINE_CAP) -> str:
    """Server text as a clearly delimited quotation."""
    return f"“{clean_text(value, cap=cap)}”"


# --- output -----------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Reporter:
    """Writes events either as human lines or as one JSON object per line."""

    as_json: bool
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    task_id: str | None = None
    """The task created so far, to name it when we stop following early."""

    def event(self, name: str, human: str | None, **fields: Any) -> None:
        if name == "task_created":
            self.task_id = fields["taskId"]
        if self.as_json:
            self.out.write(json.dumps({"event": name, **fields}) + "\n")
        elif human is not None:
            self.out.write(human + "\n")
        self.out.flush()

    def human(self, line: str) -> None:
        if not self.as_json:
            self.out.write(line + "\n")
            self.out.flush()

    def still_running(self) -> str:
        if self.task_id is None:
            return "no task was created"
        return f"task {clean_text(self.task_id, cap=120)} keeps running on the server"

    def problem(self, message: str) -> None:
        self.err.write(f"taskhub.mcp: {message}\n")
        self.err.flush()


def status_line(snapshot: TaskSnapshot) -> str:
    line = f"status: {snapshot.status}"
    if snapshot.status_message:
        line += f" — server says {quoted(snapshot.status_message)}"
    return line


def report_task_created(reporter: Reporter, snapshot: TaskSnapshot) -> None:
    reporter.event(
        "task_created",
        f"task {clean_text(snapshot.task_id, cap=120)} created",
        taskId=snapshot.task_id,
        status=snapshot.status,
        statusMessage=snapshot.status_message,
        pollIntervalMs=snapshot.poll_interval_ms,
        ttlMs=snapshot.ttl_ms,
    )


def report_status(reporter: Reporter, snapshot: TaskSnapshot) -> None:
    reporter.event(
        "status",
        status_line(snapshot),
        taskId=snapshot.task_id,
        status=snapshot.status,
        statusMessage=snapshot.status_message,
    )


# A progress line at most this often (a server may report hundreds a second); the last one of a run is always shown.
PROGRESS_LINE_EVERY_S = 0.25


@dataclass
class ProgressLines:
    """`on_progress` of a call and of the 2025-11-25 task it made: "progress: 3 of 6 — server says “…”"."""

    reporter: Reporter
    _shown_at: float = float("-inf")
    _shown: tuple[float, float | None, str | None] | None = None

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        now = time.monotonic()
        reached_total = total is not None and progress >= total
        if (progress, total, message) == self._shown or (
            now - self._shown_at < PROGRESS_LINE_EVERY_S and not reached_total
        ):
            return
        self._shown, self._shown_at = (progress, total, message), now
        line = f"progress: {progress:g}" + (f" of {total:g}" if total is not None else "")
        if message:
            line += f" — server says {quoted(message)}"
        self.reporter.event("progress", line, progress=progress, total=total, message=message)


def describe_content(item: Any) -> str:
    """One content block for a terminal: text as is (cleaned), anything else summarised."""
    if not isinstance(item, dict):
        return f"[unrecognised content: {clean_text(item, cap=80)}]"
    kind = item.get("type")
    if kind == "text":
        return clean_text(item.get("text", ""), multiline=True, cap=TEXT_CAP)
    if kind in ("image", "audio"):
        size = len(item.get("data") or "")
        return f"[{kind}: {clean_text(item.get('mimeType', '?'), cap=80)}, {size} base64 characters]"
    if kind == "resource_link":
        name = f" ({clean_text(item['name'], cap=80)})" if item.get("name") else ""
        return f"[resource link: {clean_text(item.get('uri', '?'))}{name}]"
    if kind == "resource":
        resource = item.get("resource") if isinstance(item.get("resource"), dict) else {}
        mime = f", {clean_text(resource['mimeType'], cap=80)}" if resource.get("mimeType") else ""
        return f"[embedded resource: {clean_text(resource.get('uri', '?'))}{mime}]"
    return f"[{clean_text(kind, cap=80)} content]"


def print_tool_result(reporter: Reporter, result: Mapping[str, Any]) -> None:
    if result.get("isError"):
        reporter.human("the tool reported an error (isError):")
    for item in result.get("content") or []:
        reporter.human(describe_content(item))
    if "structuredContent" in result:
        reporter.human("structured content: " + clean_text(result["structuredContent"], cap=TEXT_CAP))


def exit_status_of_result(result: Mapping[str, Any]) -> int:
    return EXIT_TOOL_ERROR if result.get("isError") else EXIT_COMPLETED


# --- answers ----------------------------------------------------------------------------------------


def parse_json_argument(text: str, *, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{what} is not valid JSON: {error}") from None


def load_answers(*, answer_options: list[str], answers_file: str | None) -> dict[str, dict[str, Any]]:
    """`--answers-file` first, then each `--answer KEY=JSON` (which wins on the same key)."""
    answers: dict[str, Any] = {}
    if answers_file is not None:
        try:
            text = Path(answers_file).read_text(encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot read --answers-file: {error}") from None
        loaded = parse_json_argument(text, what=f"--answers-file {answers_file}")
        if not isinstance(loaded, dict):
            raise UsageError("--answers-file must hold a JSON object mapping a key (or '*') to a response")
        answers.update(loaded)
    for option in answer_options:
        key, equals, value = option.partition("=")
        if not equals or not key:
            raise UsageError(f"--answer must look like KEY=JSON, got {option!r}")
        answers[key] = parse_json_argument(value, what=f"--answer {key}")
    for key, response in answers.items():
        if not isinstance(response, dict):
            raise UsageError(f'the answer for {key!r} must be a JSON object such as {{"action": "accept", ...}}')
    return answers


def request_message(request: Mapping[str, Any]) -> str | None:
    params = request.get("params")
    message = params.get("message") if isinstance(params, dict) else None
    return message if isinstance(message, str) else None


def request_url(request: Mapping[str, Any]) -> str | None:
    params = request.get("params")
    if isinstance(params, dict) and params.get("mode") == "url" and isinstance(params.get("url"), str):
        return params["url"]
    return None


class TerminalPrompter:
    """Asks a person on the terminal for one input request (form fields, or consent to a URL)."""

    def __init__(self, *, server: str, err: TextIO) -> None:
        self._server = server
        self._err = err

    async def ask(self, key: str, request: Mapping[str, Any]) -> dict[str, Any]:
        method = request.get("method")
        params = request.get("params") if isinstance(request.get("params"), dict) else {}
        if method != "elicitation/create":
            raise UsageError(f"input request {key!r} ({clean_text(method, cap=80)}) cannot be answered on a terminal")
        self._say(f"\nThe server {clean_text(self._server)} asks [{clean_text(key, cap=80)}]:")
        self._say(f"  {quoted(params.get('message', ''), cap=2000)}")
        url = request_url(request)
        if url is not None:
            self._say(f"  URL (not opened; open it yourself if you consent): {clean_text(url, cap=None)}")
        if url is not None:
            return {"action": await self._ask_action()}
        fields = schema_fields.build_fields(params.get("requestedSchema", {}), schema_fields.ELICITATION)
        if not fields.renderable:
            self._say(f"  this form cannot be filled in ({clean_text(fields.problem)}); decline or cancel it")
            return {"action": await self._ask_action(may_accept=False)}
        action = await self._ask_action()
        if action != "accept":
            return {"action": action}
        return {"action": "accept", "content": await self._ask_fields(fields)}

    async def _ask_action(self, *, may_accept: bool = True) -> str:
        if may_accept:
            choices = {"": "accept", "a": "accept", "accept": "accept", "d": "decline", "decline": "decline"}
            prompt = "  respond? [a]ccept / [d]ecline / [c]ancel (default accept): "
        else:
            choices = {"d": "decline", "decline": "decline"}
            prompt = "  respond? [d]ecline / [c]ancel: "
        choices |= {"c": "cancel", "cancel": "cancel"}
        while True:
            reply = (await self._read(prompt)).lower()
            if reply in choices:
                return choices[reply]

    async def _ask_fields(self, fields: schema_fields.FieldSet) -> dict[str, Any]:
        content: dict[str, Any] = {}
        for form_field in fields.answerable_fields:
            value = await self._ask_field(form_field)
            if value is not schema_fields.OMIT:
                content[form_field.name] = value
        return content

    async def _ask_field(self, form_field: schema_fields.SchemaField) -> Any:
        label = clean_text(form_field.label, cap=120)
        if form_field.help:
            label += f" ({clean_text(form_field.help, cap=200)})"
        for index, choice in enumerate(form_field.choices, 1):
            self._say(f"    {index}. {clean_text(choice.label, cap=120)}")
        hint = field_hint(form_field)
        while True:
            try:
                return answer_from_reply(form_field, await self._read(f"  {label} {hint}: "))
            except ValueError as error:
                self._say(f"  {clean_text(str(error))}")

    def _say(self, line: str) -> None:
        self._err.write(line + "\n")
        self._err.flush()

    async def _read(self, prompt: str) -> str:
        self._err.write(prompt)
        self._err.flush()
        line = await asyncio.to_thread(sys.stdin.readline)
        if line == "":
            raise UsageError("stdin closed while waiting for an answer")
        return line.strip()


def field_hint(form_field: schema_fields.SchemaField) -> str:
    if form_field.widget in ("checkbox", "tristate"):
        parts = ["yes/no"]
    elif form_field.widget == "checkboxes":
        parts = ["numbers or values, comma separated"]
    elif form_field.widget == "select":
        parts = ["number or value"]
    else:
        parts = [str(form_field.kind)]
    if form_field.schema.get("format"):
        parts.append(f"format {form_field.schema['format']}")
    if form_field.has_default:
        parts.append(f"default {form_field.default!r}")
    elif not form_field.required:
        parts.append("optional, empty to skip")
    return clean_text("[" + ", ".join(parts) + "]", cap=200)


def answer_from_reply(form_field: schema_fields.SchemaField, reply: str) -> Any:
    """One field's value from what was typed, checked against its schema (ValueError says what is wrong, in the
    words of the web forms); OMIT when an optional field is skipped."""
    value = schema_fields.value_from_text(form_field, reply)
    if value is schema_fields.OMIT:
        if form_field.required:
            raise schema_fields.FieldInputError(schema_fields.REQUIRED)
        return value
    problem = schema_fields.field_error(form_field, value)
    if problem:
        raise schema_fields.FieldInputError(problem)
    return value


def argument_errors(tool: Mapping[str, Any] | None, arguments: dict[str, Any]) -> str:
    """What is wrong with `--args` for the tool as the server lists it ("" when they fit or it is not listed)."""
    if tool is None:
        return ""
    schema = tool.get("inputSchema")
    required = schema.get("required") if isinstance(schema, dict) else None
    required = set(required) if isinstance(required, list) and all(isinstance(n, str) for n in required) else set()
    # A null optional argument reads as "not given" (SEP-2243 omits its header too): the server judges it.
    checked = {name: value for name, value in arguments.items() if value is not None or name in required}
    errors = schema_fields.validate(schema, checked, schema_fields.TOOL)
    return schema_fields.messages_of(errors)


@dataclass(kw_only=True)
class Answerer:
    """Finds the response to each input request: pre-supplied answers first, then the terminal."""

    answers: dict[str, dict[str, Any]]
    reporter: Reporter
    prompter: TerminalPrompter | None
    question_failed: Exception | None = None  # a question asked in the middle of the call that could not be answered

    async def respond_all(self, requests: Mapping[str, dict[str, Any]], *, task_id: str | None) -> dict[str, Any]:
        for key, request in requests.items():
            check_input_request(key, request)
        for key, request in requests.items():
            self._announce(key, request, task_id=task_id)
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            responses[key] = await self._respond(key, request)
        return responses

    async def ask_question(self, question: Question) -> dict[str, Any]:
        """A question the server asks in the middle of the call (a classic `elicitation/create`): answered as an
        input request of key `call:<its JSON-RPC id>` (or `*`), the form's defaults filling what the answer omits
        (SEP-1034)."""
        key = f"call:{question.server_request_id}"
        request = {"method": question.method, "params": question.params}
        try:
            check_input_request(key, request)
            self._announce(key, request, task_id=None)
            response = with_defaults(request, await self._respond(key, request))
        except (UsageError, InvalidResult) as error:  # said once the call returns (call_with_mrtr)
            self.question_failed = self.question_failed or error
            return {"action": "cancel"}
        self.report_answered({key: response}, task_id=None)
        return response

    def _announce(self, key: str, request: Mapping[str, Any], *, task_id: str | None) -> None:
        line = f"input required [{clean_text(key, cap=80)}]"
        message = request_message(request)
        if message is not None:
            line += f" — server asks {quoted(message)}"
        url = request_url(request)
        if url is not None:
            line += f"\n  URL: {clean_text(url, cap=None)}"
        self.reporter.event("input_required", line, taskId=task_id, key=key, request=request)

    async def _respond(self, key: str, request: Mapping[str, Any]) -> dict[str, Any]:
        response = self.answers.get(key, self.answers.get(WILDCARD_KEY))
        if response is not None:
            return response
        if self.prompter is not None:
            return await self.prompter.ask(key, request)
        raise UsageError(
            f"input request {clean_text(key, cap=80)!r} needs an answer and stdin is not a terminal; "
            f'pass --answer {clean_text(key, cap=80)}=\'{{"action":"accept","content":{{...}}}}\' or --answers-file'
        )

    def report_answered(self, responses: Mapping[str, Any], *, task_id: str | None) -> None:
        for key, response in responses.items():
            action = response.get("action") if isinstance(response, dict) else None
            human = f"answered [{clean_text(key, cap=80)}]" + (f" ({clean_text(action, cap=40)})" if action else "")
            self.reporter.event("answered", human, taskId=task_id, key=key, action=action)


def with_defaults(request: Mapping[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """An accepted form answer with the schema's default for each field it leaves out (SEP-1034: a client applies
    the defaults of omitted fields)."""
    params = request.get("params") if isinstance(request.get("params"), dict) else {}
    if response.get("action") != "accept" or request.get("method") != "elicitation/create":
        return response
    if params.get("mode", "form") != "form":
        return response
    content = response.get("content") if isinstance(response.get("content"), dict) else {}
    defaults = schema_fields.defaults_of(params.get("requestedSchema"))
    return {**response, "content": {**defaults, **content}}


def check_input_request(key: str, request: Any) -> None:
    """An input request nobody should be shown: not an object, or a form whose requestedSchema is no object schema."""
    where = f"input request {clean_text(key, cap=80)!r}"
    if not isinstance(request, dict):
        raise InvalidResult(f"{where} is not an object")
    if request.get("method") != "elicitation/create":
        return
    params = request.get("params")
    if not isinstance(params, dict):
        raise InvalidResult(f"{where}: params is not an object")
    if params.get("mode", "form") != "form":
        return
    schema = params.get("requestedSchema")
    properties = schema.get("properties", {}) if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "object" or not isinstance(properties, dict):
        raise InvalidResult(f"{where}: requestedSchema is not an object schema ({clean_text(schema, cap=80)})")


class CancelNotConfirmed(Exception):
    """The cancel was sent, but the task did not end within --cancel-wait: exit status 3 all the same."""


# --- following a task -------------------------------------------------------------------------------


@dataclass(kw_only=True)
class TaskFollower:
    """Observes one task to its terminal state: status lines, answers, an optional cancel."""

    client: TasksClient
    reporter: Reporter
    answerer: Answerer
    cancel_at: float | None
    listen: bool
    cancel_wait: float = DEFAULT_CANCEL_WAIT_S
    answered_keys: set[str] = field(default_factory=set)
    cancel_sent: bool = False
    task_id: str = field(init=False, default="")
    last_status: tuple[str, str | None] | None = field(init=False, default=None)
    _cancel_deadline: asyncio.Timeout | None = field(init=False, default=None)

    async def run(self, snapshot: TaskSnapshot) -> TaskSnapshot:
        """The task's last snapshot; CancelNotConfirmed when a cancel was sent and the task did not end in time."""
        try:
            async with asyncio.timeout(None) as self._cancel_deadline:
                return await self._run(snapshot)
        except TimeoutError:
            if self._cancel_deadline is None or not self._cancel_deadline.expired():
                raise
            raise CancelNotConfirmed(
                f"the server did not confirm the cancel: the task did not end within {self.cancel_wait:g}s"
                f" (--cancel-wait); {self.reporter.still_running()}"
            ) from None

    async def _run(self, snapshot: TaskSnapshot) -> TaskSnapshot:
        report_task_created(self.reporter, snapshot)
        await self._observe(snapshot)
        if snapshot.status == "completed" and snapshot.result is None:
            # A task handle carries no result: tasks/get has it.
            snapshot = await self.client.get_task(snapshot.task_id)
            await self._observe(snapshot)
        if snapshot.is_terminal:
            return snapshot
        if self.listen:
            return await self._follow_by_notifications(snapshot)
        return await self._follow_by_polling(snapshot)

    async def _follow_by_polling(self, snapshot: TaskSnapshot) -> TaskSnapshot:
        while not snapshot.is_terminal:
            await self._wait(poll_interval(snapshot))
            snapshot = await self.client.get_task(snapshot.task_id)
            await self._observe(snapshot)
        return snapshot

    async def _follow_by_notifications(self, snapshot: TaskSnapshot) -> TaskSnapshot:
        async with contextlib.AsyncExitStack() as stack:
            subscription = await self._open_subscription(stack, task_id=snapshot.task_id)
            if subscription is not None:
                snapshot = await self._follow_subscription(subscription, snapshot)
        # Polling takes over when the server refuses the subscription or the stream ends early.
        return await self._follow_by_polling(snapshot)

    async def _open_subscription(self, stack: contextlib.AsyncExitStack, *, task_id: str) -> TaskSubscription | None:
        try:
            subscription = await stack.enter_async_context(self.client.listen([task_id]))
        except ProtocolError as error:
            self.reporter.problem(f"cannot listen for task notifications ({clean_text(str(error))}); polling instead")
            return None
        if task_id not in subscription.accepted_task_ids:
            self.reporter.problem("the server did not accept the task subscription; polling instead")
            return None
        return subscription

    async def _follow_subscription(self, subscription: TaskSubscription, snapshot: TaskSnapshot) -> TaskSnapshot:
        # Changes between task creation and the acknowledgement reached nobody.
        snapshot = await self.client.get_task(snapshot.task_id)
        await self._observe(snapshot)
        while not snapshot.is_terminal:
            notified = await self._next_notification(subscription, timeout=safety_poll_interval(snapshot))
            if notified is _STREAM_ENDED:
                self.reporter.problem("the task notification stream ended; polling instead")
                break
            snapshot = notified if notified is not None else await self.client.get_task(snapshot.task_id)
            await self._observe(snapshot)
        return snapshot

    async def _next_notification(self, subscription: TaskSubscription, *, timeout: float) -> Any:
        """The next snapshot, None when the safety poll is due, or _STREAM_ENDED."""
        deadline = time.monotonic() + timeout
        while True:
            wake = self._until_cancel_or(deadline)
            try:
                return await asyncio.wait_for(anext(subscription), max(0.0, wake - time.monotonic()))
            except StopAsyncIteration:
                return _STREAM_ENDED
            except McpClientError as error:
                self.reporter.problem(f"task notifications lost ({clean_text(str(error))})")
                return _STREAM_ENDED
            except TimeoutError:
                await self._cancel_if_due()
                if time.monotonic() >= deadline:
                    return None

    async def _wait(self, seconds: float) -> None:
        """Sleep between polls, sending the cancel on time if one is scheduled meanwhile."""
        deadline = time.monotonic() + seconds
        await self._cancel_if_due()
        while (now := time.monotonic()) < deadline:
            await asyncio.sleep(self._until_cancel_or(deadline) - now)
            await self._cancel_if_due()

    def _until_cancel_or(self, deadline: float) -> float:
        if self.cancel_at is not None and not self.cancel_sent:
            return min(deadline, self.cancel_at)
        return deadline

    async def _cancel_if_due(self) -> None:
        if self.cancel_at is None or self.cancel_sent or time.monotonic() < self.cancel_at:
            return
        self.cancel_sent = True
        task_id = self.task_id
        if self._cancel_deadline is not None:
            self._cancel_deadline.reschedule(asyncio.get_running_loop().time() + self.cancel_wait)
        await self.client.cancel_task(task_id)
        self.reporter.event("cancel_sent", "cancel sent (tasks/cancel); following the task to its end", taskId=task_id)

    async def _observe(self, snapshot: TaskSnapshot) -> None:
        if self.task_id and snapshot.task_id != self.task_id:
            raise InvalidResult(f"the server answered about another task, {clean_text(snapshot.task_id, cap=80)!r}")
        self.task_id = snapshot.task_id
        status = (snapshot.status, snapshot.status_message)
        if status != self.last_status:
            self.last_status = status
            report_status(self.reporter, snapshot)
        await self._cancel_if_due()
        if snapshot.status == "input_required" and not self.cancel_sent:
            await self._answer(snapshot)

    async def _answer(self, snapshot: TaskSnapshot) -> None:
        outstanding = {
            key: request for key, request in (snapshot.input_requests or {}).items() if key not in self.answered_keys
        }
        if not outstanding:
            return
        responses = await self.answerer.respond_all(outstanding, task_id=snapshot.task_id)
        # Remembered before sending: a key is never sent twice, even if the send fails midway.
        self.answered_keys.update(responses)
        await self.client.update_task(snapshot.task_id, responses)
        self.answerer.report_answered(responses, task_id=snapshot.task_id)


_STREAM_ENDED = object()


def poll_interval(snapshot: TaskSnapshot) -> float:
    """The server's hint, within the bounds the tracker keeps it in."""
    return wire.bounded_poll_interval_ms(snapshot.poll_interval_ms) / 1000


def safety_poll_interval(snapshot: TaskSnapshot) -> float:
    return max(SAFETY_POLL_INTERVAL_S, poll_interval(snapshot))


# --- commands ---------------------------------------------------------------------------------------


async def call_with_mrtr(
    client: TasksClient, *, tool: str, arguments: dict[str, Any], answerer: Answerer, progress: ProgressLines
) -> ToolCompleted | TaskCreated:
    """`tools/call`, retried with answers and the exact `requestState` while the server asks for input."""
    input_responses: dict[str, Any] | None = None
    request_state: str | None = None
    for _ in range(MAX_MRTR_ROUNDS):
        outcome = await client.call_tool(
            tool,
            arguments,
            input_responses=input_responses,
            request_state=request_state,
            asker=answerer.ask_question,
            on_progress=progress,
        )
        if answerer.question_failed is not None:
            raise answerer.question_failed
        if not isinstance(outcome, ToolInputRequired):
            return outcome
        input_responses = await answerer.respond_all(outcome.input_requests, task_id=None)
        request_state = outcome.request_state
        answerer.report_answered(input_responses, task_id=None)
    raise InvalidResult(f"tools/call: the server still asks for input after {MAX_MRTR_ROUNDS} rounds")


class _SessionTaskFollower(session_tasks.SessionTaskFollower):
    """Status lines as the task's status changes, `tasks/cancel` at `cancel_at`."""

    tolerate_refused_reads = False

    def __init__(
        self,
        client: TasksClient,
        created: TaskSnapshot,
        *,
        reporter: Reporter,
        answerer: Answerer,
        cancel_at,
        on_progress: ProgressLines,
        progress_token: str | None,
    ) -> None:
        super().__init__(
            client, created, asker=answerer.ask_question, on_progress=on_progress, progress_token=progress_token
        )
        self.reporter = reporter
        self.cancel_at = cancel_at
        self.shown: tuple[str, str | None] | None = None

    def next_look_s(self, last: TaskSnapshot) -> float:
        if self.cancel_at is None:
            return poll_interval(last)
        return min(poll_interval(last), max(0.0, self.cancel_at - time.monotonic()))

    async def seen(self, snapshot: TaskSnapshot, source: str) -> None:
        if (snapshot.status, snapshot.status_message) != self.shown:
            self.shown = (snapshot.status, snapshot.status_message)
            report_status(self.reporter, snapshot)

    async def cancel_due(self) -> bool:
        if self.cancel_at is None or time.monotonic() < self.cancel_at:
            return False
        self.cancel_at = None
        return True

    async def cancel_sent(self, answered: TaskSnapshot) -> None:
        self.reporter.event(
            "cancel_sent", "cancel sent (tasks/cancel); following the task to its end", taskId=answered.task_id
        )
        await self.seen(answered, "tasks/cancel")


async def follow_session_task(
    client: TasksClient,
    created: TaskCreated,
    *,
    reporter: Reporter,
    answerer: Answerer,
    cancel_at: float | None,
    progress: ProgressLines,
) -> TaskSnapshot:
    """A 2025-11-25 task to its end on this session (taskhub.mcp.session_tasks.SessionTaskFollower): its questions
    answered as a call's are, a status line when its status changes, a progress line as the server reports it,
    `tasks/cancel` at `cancel_at`. Returns the end as the extension states it."""
    follower = _SessionTaskFollower(
        client,
        created.task,
        reporter=reporter,
        answerer=answerer,
        cancel_at=cancel_at,
        on_progress=progress,
        progress_token=created.progress_token,
    )
    report_task_created(reporter, created.task)
    await follower.seen(created.task, "tools/call")
    final = await follower.run()
    if answerer.question_failed is not None:
        raise answerer.question_failed
    return final


def report_final(reporter: Reporter, snapshot: TaskSnapshot) -> int:
    if snapshot.status == "completed":
        result = snapshot.tool_result or {"content": []}
        reporter.event("outcome", None, status="completed", taskId=snapshot.task_id, result=result)
        print_tool_result(reporter, result)
        return exit_status_of_result(result)
    if snapshot.status == "failed":
        error = snapshot.error or {}
        reporter.event("outcome", None, status="failed", taskId=snapshot.task_id, error=error)
        reporter.human(
            f"task failed: error {clean_text(error.get('code'))}, server says {quoted(error.get('message'))}"
        )
        return EXIT_FAILED
    reporter.event("outcome", None, status="cancelled", taskId=snapshot.task_id)
    reporter.human("task cancelled")
    return EXIT_CANCELLED


async def run_call(args: argparse.Namespace, reporter: Reporter) -> int:
    arguments = parse_tool_arguments(args.args)
    answerer = Answerer(
        answers=load_answers(answer_options=args.answer, answers_file=args.answers_file),
        reporter=reporter,
        prompter=TerminalPrompter(server=describe_target(args), err=reporter.err) if sys.stdin.isatty() else None,
    )
    async with opened_target(args, reporter) as target, TasksClient(target, timeout=request_timeout(args)) as client:
        # The listing also teaches the client the tool's `x-mcp-header` parameters (mirrored into `Mcp-Param-*`
        # headers by every `tools/call` below) and whether the tool may be called at all.
        listed = next((tool for tool in (await client.discover()).tools if tool.get("name") == args.tool), None)
        client.check_tool(args.tool)
        if problems := argument_errors(listed, arguments):
            raise UsageError(f"the arguments do not fit the tool's input schema: {clean_text(problems, cap=1000)}")
        progress = ProgressLines(reporter)
        outcome = await call_with_mrtr(
            client, tool=args.tool, arguments=arguments, answerer=answerer, progress=progress
        )
        if isinstance(outcome, ToolCompleted):
            reporter.event("outcome", None, status="completed", taskId=None, result=outcome.result)
            print_tool_result(reporter, outcome.result)
            return exit_status_of_result(outcome.result)
        cancel_at = time.monotonic() + args.cancel_after if args.cancel_after is not None else None
        if outcome.on_session:
            final = await follow_session_task(
                client, outcome, reporter=reporter, answerer=answerer, cancel_at=cancel_at, progress=progress
            )
            return report_final(reporter, final)
        follower = TaskFollower(
            client=client,
            reporter=reporter,
            answerer=answerer,
            cancel_at=cancel_at,
            listen=args.listen,
            cancel_wait=args.cancel_wait,
        )
        try:
            final = await follower.run(outcome.task)
        except CancelNotConfirmed as error:
            reporter.event("outcome", None, status="cancel_unconfirmed", taskId=follower.task_id)
            reporter.problem(str(error))
            return EXIT_CANCELLED
        return report_final(reporter, final)


def parse_tool_arguments(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    arguments = parse_json_argument(text, what="--args")
    if not isinstance(arguments, dict):
        raise UsageError("--args must be a JSON object")
    return arguments


async def run_discover(args: argparse.Namespace, reporter: Reporter) -> int:
    async with opened_target(args, reporter) as target, TasksClient(target, timeout=request_timeout(args)) as client:
        discovery = await client.discover()
    if reporter.as_json:
        document = {"discover": discovery.raw, "tools": discovery.tools, "protocolVersion": discovery.protocol_version}
        reporter.out.write(json.dumps(document) + "\n")
        return EXIT_COMPLETED
    info = discovery.server_info or {}
    reporter.human(f"server: {clean_text(info.get('name', '?'))} {clean_text(info.get('version', ''))}".rstrip())
    reporter.human(f"protocol version: {clean_text(discovery.protocol_version)}")
    reporter.human("capabilities:")
    for name, value in discovery.capabilities.items():
        if name == "extensions" and isinstance(value, dict):
            reporter.human(f"  extensions: {clean_text(', '.join(value) or '(none)')}")
        else:
            reporter.human(f"  {clean_text(name, cap=80)}: {clean_text(value)}")
    reporter.human(f"tools ({len(discovery.tools)}):")
    for tool in discovery.tools:
        reporter.human(f"  {clean_text(tool.get('name', '?'), cap=80)} — {clean_text(tool.get('description', ''))}")
        reporter.human(f"      args: {schema_summary(tool.get('inputSchema'))}")
        if (problem := tool_headers.header_problem(tool.get("inputSchema"))) is not None:
            reporter.human(f"      cannot be called: invalid x-mcp-header annotations ({clean_text(problem)})")
    return EXIT_COMPLETED


def schema_summary(schema: Any) -> str:
    """`name: type (required), other: type = default` on one line."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not properties:
        return "(none)"
    required = set(schema.get("required") or [])
    parts = []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        part = f"{name}: {spec.get('type', 'any')}"
        if name in required:
            part += " (required)"
        if "default" in spec:
            part += f" = {json.dumps(spec['default'])}"
        parts.append(part)
    return clean_text(", ".join(parts))


# --- from arguments to a target -------------------------------------------------------------------


def build_target(args: argparse.Namespace) -> ServerTarget:
    if args.stdio is not None:
        if args.header or args.bearer:
            raise UsageError("--header and --bearer apply to --url only")
        try:
            command = shlex.split(args.stdio)
        except ValueError as error:
            raise UsageError(f"--stdio: {error}") from None
        if not command:
            raise UsageError("--stdio needs a command")
        return StdioTarget(command=command[0], args=command[1:], own_answers=parse_roots(args.root))
    return HttpTarget(
        url=args.url, headers=parse_headers(args.header), bearer_token=args.bearer, own_answers=parse_roots(args.root)
    )


@contextlib.asynccontextmanager
async def opened_target(args: argparse.Namespace, reporter: Reporter) -> AsyncIterator[ServerTarget]:
    """The target the arguments name, authorized by OAuth when they ask for it (see :func:`build_target`); an
    authorization that fails is reported as AuthorizationFailed (exit 4) with what went wrong."""
    target = build_target(args)
    if not oauth_requested(args):
        try:
            yield target
        except AuthorizationFailed as error:
            data = error.data if isinstance(error.data, dict) else {}
            if not isinstance(target, HttpTarget) or args.bearer or data.get("httpStatus") != 401:
                raise
            hint = f"{error.message}; if the server uses OAuth, authorize with --oauth (see --help)"
            raise AuthorizationFailed(error.code, hint, error.data, method=error.method) from None
        return
    if not isinstance(target, HttpTarget):
        raise UsageError("the OAuth flags apply to --url only")
    if args.bearer or any(name.lower() == "authorization" for name in target.headers):
        raise UsageError("--bearer or an Authorization header cannot be combined with the OAuth flags")
    from taskhub.mcp import oauth  # the authorization side: only a command that authorizes loads it

    settings = oauth_settings(args)
    async with contextlib.AsyncExitStack() as stack:
        redirect: Any = None
        if not settings.client_credentials:
            if args.oauth_unattended:
                redirect = oauth.UnattendedRedirect(outbound=target.outbound())
            else:
                loopback = oauth.LoopbackRedirect(
                    port=args.redirect_port, announce=lambda url: announce_authorization(reporter, url)
                )
                try:
                    redirect = await stack.enter_async_context(loopback)
                except OSError as error:
                    raise UsageError(f"cannot listen for the redirect on 127.0.0.1: {error.strerror}") from None
        try:
            storage: Any = oauth.MemoryTokenStore()
            if args.token_file is not None:
                storage = oauth.FileTokenStore(Path(args.token_file), resource=target.url)
                storage.load()
            provider = oauth.oauth_provider(
                server_url=target.url, settings=settings, storage=storage, redirect=redirect
            )
        except oauth.AuthorizationProblem as error:
            raise UsageError(str(error)) from None
        try:
            if isinstance(redirect, oauth.LoopbackRedirect):
                await authorize_person_ahead(target, provider)
            yield dataclasses.replace(target, auth=provider)
        except McpClientError:
            if (problem := provider.failure_message()) is None:
                raise
            raise AuthorizationFailed(INTERNAL_ERROR, f"authorization failed: {problem}") from None


async def authorize_person_ahead(target: HttpTarget, provider: Any) -> None:
    """A person authorizes before the session opens (its requests time out long before a person is done); anything
    but an authorization failure is left for the session to meet and report."""
    from taskhub.mcp import oauth

    try:
        await oauth.authorize_ahead(
            server_url=target.url, auth=provider, outbound=target.outbound(), protocol_version=wire.PROTOCOL_VERSION
        )
    except Exception as error:
        if (problem := provider.failure_message()) is not None:
            raise AuthorizationFailed(INTERNAL_ERROR, f"authorization failed: {problem}") from None
        logging.getLogger(__name__).debug("authorizing ahead: %s", type(error).__name__)


def oauth_settings(args: argparse.Namespace) -> Any:
    from taskhub.mcp.oauth import OAuthClientSettings

    return OAuthClientSettings(
        client_id=args.client_id,
        client_secret=read_secret_file(args.client_secret_file, what="--client-secret-file"),
        client_auth=args.client_auth,
        client_metadata_url=args.client_metadata_url,
        client_credentials=args.client_credentials,
        private_key_pem=read_secret_file(args.private_key_file, what="--private-key-file"),
        signing_algorithm=args.jwt_algorithm,
        scope=args.scope,
        issuer=args.issuer,
    )


SECRET_FILE_LIMIT = 64_000


def read_secret_file(path: str | None, *, what: str) -> str | None:
    """A secret kept in a file (never on the command line, where other users' `ps` sees it), trailing newline off."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(SECRET_FILE_LIMIT + 1)
    except (OSError, UnicodeError) as error:
        raise UsageError(f"cannot read {what}: {getattr(error, 'strerror', None) or error}") from None
    if len(text) > SECRET_FILE_LIMIT or not text.strip():
        raise UsageError(f"{what} must hold the secret (and nothing larger than {SECRET_FILE_LIMIT} bytes)")
    return text.rstrip("\r\n") if "PRIVATE KEY" not in text else text


def announce_authorization(reporter: Reporter, url: str) -> None:
    """The URL a person opens to authorize (built from the authorization server's metadata: shown cleaned)."""
    reporter.event("authorization_needed", None, url=url)
    reporter.problem("the server asks for authorization; open this URL in a browser:")
    reporter.err.write(f"  {clean_text(url, cap=None)}\n")
    reporter.err.write("waiting for the authorization server to redirect back to this machine …\n")
    reporter.err.flush()


def parse_roots(options: list[str]) -> OwnAnswers:
    roots = []
    for option in options:
        uri, _, name = option.partition("=")
        if not uri.startswith("file://") or any(char.isspace() or not char.isprintable() for char in uri):
            raise UsageError(f"--root must be a file:// URI (optionally =NAME), got {option!r}")
        roots.append((uri, name))
    return OwnAnswers(roots=tuple(roots))


def parse_headers(options: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for option in options:
        name, colon, value = option.partition(":")
        if not colon or not name.strip() or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name.strip()):
            raise UsageError(f"--header must look like 'Name: value', got {option!r}")
        headers[name.strip()] = value.strip()
    return headers


def describe_target(args: argparse.Namespace) -> str:
    return args.url if args.url is not None else args.stdio


def request_timeout(args: argparse.Namespace) -> float:
    return DEFAULT_REQUEST_TIMEOUT_S if args.timeout is None else min(args.timeout, DEFAULT_REQUEST_TIMEOUT_S)


# --- entry point ------------------------------------------------------------------------------------


COMMANDS: dict[str, Callable[[argparse.Namespace, Reporter], Any]] = {"call": run_call, "discover": run_discover}


async def run_command(args: argparse.Namespace, reporter: Reporter) -> int:
    command = COMMANDS[args.command]
    try:
        async with asyncio.timeout(args.timeout) as deadline:
            return await command(args, reporter)
    except TimeoutError:
        if not deadline.expired():
            raise
        raise RequestTimeout(f"gave up after {args.timeout:g}s (--timeout); {reporter.still_running()}") from None


def report_error(reporter: Reporter, error: Exception, *, exit_status: int, as_outcome: bool) -> int:
    message = clean_text(str(error), cap=1000)
    if as_outcome:
        error_object = {"kind": type(error).__name__, "message": str(error)}
        reporter.event("outcome", None, status="error", error=error_object, exitStatus=exit_status)
    kind = "error" if isinstance(error, UsageError) else type(error).__name__
    reporter.problem(f"{kind}: {message}")
    return exit_status


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Carry out parsed arguments (see :func:`taskhub.mcp.cli_args.main`)."""
    # What goes wrong reaches the user as one line (report_error); the SDK's and our own log records of a server's
    # bad answers (a pydantic dump, a traceback) would otherwise be printed by logging's last-resort handler.
    logging.getLogger().addHandler(logging.NullHandler())
    reporter = Reporter(as_json=args.json)
    # A `call --json` stream always ends with its outcome; `discover --json` prints its document or nothing.
    as_outcome = args.json and args.command == "call"
    try:
        return asyncio.run(run_command(args, reporter))
    except UsageError as error:
        return report_error(reporter, error, exit_status=EXIT_USAGE, as_outcome=as_outcome)
    except McpClientError as error:
        return report_error(reporter, error, exit_status=EXIT_PROTOCOL_ERROR, as_outcome=as_outcome)
    except KeyboardInterrupt:
        reporter.problem(f"interrupted; {reporter.still_running()}")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went (`… | head`): no traceback, nothing more written (Python's docs' way)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
