"""What each demo tool does, as a pure function of stored facts and the clock.

A task's state is never held by a coroutine: `script(facts, now)` derives the phase the task is in at
`now` from what is stored (arguments, creation time, answers with their arrival times). Reading a task
after a server restart therefore yields exactly what it would have without the restart, and a task
"continues" simply because time moves on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskhub.demo.wire import (
    CANCELLED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    MAX_TEXT_LENGTH,
    TERMINAL_STATUSES,
    WORKING,
    bounded,
    text_result,
)

QUESTION_DELAY = 0.3  # seconds a task works before asking, so clients see working -> input_required
FOLLOW_UP = 0.5  # seconds a task works after its last answer before it finishes
SHORT_JOB = 1.0  # seconds the fail / tool-error style jobs run


@dataclass(frozen=True)
class Answer:
    response: Mapping[str, Any]
    answered_at: float

    @property
    def action(self) -> str:
        return str(self.response.get("action"))

    @property
    def content(self) -> Mapping[str, Any]:
        content = self.response.get("content")
        return content if isinstance(content, Mapping) else {}


@dataclass(frozen=True)
class Facts:
    """Everything stored about a task that its script may depend on."""

    task_id: str
    args: Mapping[str, Any]
    created_at: float
    answers: Mapping[str, Answer] = field(default_factory=dict)


@dataclass(frozen=True)
class FormQuestion:
    """A form-mode `elicitation/create` input request over flat primitive fields."""

    message: str
    properties: Mapping[str, Mapping[str, Any]]
    required: Sequence[str] = ()
    mode: str = "form"

    def to_wire(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object", "properties": {k: dict(v) for k, v in self.properties.items()}}
        if self.required:
            schema["required"] = list(self.required)
        return {
            "method": "elicitation/create",
            "params": {"mode": "form", "message": self.message, "requestedSchema": schema},
        }

    def problem_with(self, response: Mapping[str, Any]) -> str | None:
        """Why `response` is not an acceptable ElicitResult for this question, or None if it is."""
        action = response.get("action")
        if action not in ("accept", "decline", "cancel"):
            return "action must be accept, decline or cancel"
        if action != "accept":
            return None
        content = response.get("content", {})
        if not isinstance(content, Mapping):
            return "content must be an object"
        for name in self.required:
            if name not in content:
                return f"content is missing required field {name!r}"
        for name, schema in self.properties.items():
            if name in content and not _fits(schema, content[name]):
                return f"content field {name!r} does not match its schema"
        return None

    def kept_part(self, response: Mapping[str, Any]) -> dict[str, Any]:
        """What is worth storing of an acceptable response: the action and the fields the form asked for."""
        if response["action"] != "accept":
            return {"action": response["action"]}
        content = response.get("content", {})
        return {"action": "accept", "content": {name: content[name] for name in self.properties if name in content}}


@dataclass(frozen=True)
class UrlQuestion:
    """A URL-mode `elicitation/create` input request; accept means the user consented to open it."""

    message: str
    url: str
    mode: str = "url"

    def to_wire(self) -> dict[str, Any]:
        return {"method": "elicitation/create", "params": {"mode": "url", "message": self.message, "url": self.url}}

    def problem_with(self, response: Mapping[str, Any]) -> str | None:
        if response.get("action") not in ("accept", "decline", "cancel"):
            return "action must be accept, decline or cancel"
        return None

    def kept_part(self, response: Mapping[str, Any]) -> dict[str, Any]:
        return {"action": response["action"]}


Question = FormQuestion | UrlQuestion


def _fits(schema: Mapping[str, Any], value: Any) -> bool:
    kind = schema.get("type")
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        if not isinstance(value, str) or len(value) > schema.get("maxLength", MAX_TEXT_LENGTH):
            return False
        options = [option["const"] for option in schema.get("oneOf", ())] or schema.get("enum")
        return options is None or value in options
    return False


@dataclass(frozen=True)
class Phase:
    """What a task is doing at one moment; `since` is when this phase began (the task's lastUpdatedAt)."""

    status: str
    since: float
    message: str | None = None
    input_requests: Mapping[str, Question] = field(default_factory=dict)
    result: Mapping[str, Any] | None = None
    error: Mapping[str, Any] | None = None
    next_change_at: float | None = None  # None: nothing changes until an answer arrives

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


Script = Callable[[Facts, float], Phase]


def completed(since: float, text: str, *, is_error: bool = False) -> Phase:
    return Phase(COMPLETED, since, result=text_result(bounded(text), is_error=is_error))


def failed(since: float, code: int, message: str) -> Phase:
    return Phase(FAILED, since, message=f"Tool execution failed: {message}", error={"code": code, "message": message})


def cancelled(since: float) -> Phase:
    return Phase(CANCELLED, since, message="Cancelled at the client's request")


def work_for(facts: Facts, now: float, seconds: float, message: str, then: Callable[[float], Phase]) -> Phase:
    """Working with `message` for `seconds` after creation, then the phase `then(end)`."""
    end = facts.created_at + seconds
    if now >= end:
        return then(end)
    return Phase(WORKING, facts.created_at, message=message, next_change_at=end)


def ask_then(
    facts: Facts, now: float, questions: Mapping[str, Question], message: str, then: Callable[[float], Phase]
) -> Phase:
    """Work briefly, ask every question at once, and call `then(last_answer_time)` once all are answered.

    Answered keys drop out of `inputRequests` right away; keys are fixed per tool, so a key is never reused.
    """
    asked_at = facts.created_at + QUESTION_DELAY
    if now < asked_at:
        return Phase(WORKING, facts.created_at, message="Preparing questions", next_change_at=asked_at)
    outstanding = {key: q for key, q in questions.items() if key not in facts.answers}
    if outstanding:
        answered_times = [facts.answers[key].answered_at for key in questions if key in facts.answers]
        return Phase(INPUT_REQUIRED, max([asked_at, *answered_times]), message=message, input_requests=outstanding)
    return then(max(facts.answers[key].answered_at for key in questions))


def follow_up(now: float, answered_at: float, message: str, outcome: Phase) -> Phase:
    """Working for FOLLOW_UP seconds after the last answer, then `outcome`."""
    done_at = answered_at + FOLLOW_UP
    if now < done_at:
        return Phase(WORKING, answered_at, message=message, next_change_at=done_at)
    return outcome


def name_question(message: str) -> FormQuestion:
    return FormQuestion(message, {"name": {"type": "string", "title": "Name", "maxLength": 200}}, ("name",))


# --- the contract's tools -------------------------------------------------------------------------------------


def progress_script(facts: Facts, now: float) -> Phase:
    steps, step_seconds = facts.args["steps"], facts.args["step_ms"] / 1000
    end = facts.created_at + steps * step_seconds
    if now >= end:
        return completed(end, f"finished {steps} steps")
    done = int((now - facts.created_at) / step_seconds)
    since = facts.created_at + done * step_seconds
    return Phase(WORKING, since, message=f"step {done + 1} of {steps}", next_change_at=since + step_seconds)


def long_script(facts: Facts, now: float) -> Phase:
    seconds = facts.args["seconds"]
    end = facts.created_at + seconds
    if now >= end:
        return completed(end, f"finished after {seconds:g} s")
    elapsed = int(now - facts.created_at)
    since = facts.created_at + elapsed
    return Phase(WORKING, since, message=f"{elapsed} s of {seconds:g} s", next_change_at=min(since + 1, end))


APPROVE_QUESTION_PROPERTIES = {
    "approved": {"type": "boolean", "title": "Approve?"},
    "reason": {"type": "string", "title": "Reason", "maxLength": 500},
}


def approval_script(facts: Facts, now: float) -> Phase:
    action = facts.args["action"]
    question = FormQuestion(f"Approve {action}?", APPROVE_QUESTION_PROPERTIES, required=("approved",))

    def decide(answered_at: float) -> Phase:
        answer = facts.answers["approve"]
        if answer.action != "accept":
            outcome = completed(answered_at + FOLLOW_UP, "declined")
        else:
            verdict = "approved" if answer.content.get("approved") else "rejected"
            reason = answer.content.get("reason", "")
            outcome = completed(answered_at + FOLLOW_UP, f"{verdict}: {action} (reason: {reason})")
        return follow_up(now, answered_at, f"Applying the decision on {action}", outcome)

    return ask_then(facts, now, {"approve": question}, f"Waiting for approval of {action}", decide)


COLOR_OPTIONS = [
    {"const": "red", "title": "Red"},
    {"const": "green", "title": "Green"},
    {"const": "blue", "title": "Blue"},
]


def two_questions_script(facts: Facts, now: float) -> Phase:
    questions = {
        "name": name_question("What is your name?"),
        "color": FormQuestion(
            "Pick a color.", {"color": {"type": "string", "title": "Color", "oneOf": COLOR_OPTIONS}}, ("color",)
        ),
    }

    def finish(answered_at: float) -> Phase:
        name, color = facts.answers["name"], facts.answers["color"]
        if name.action != "accept" or color.action != "accept":
            return follow_up(now, answered_at, "Wrapping up", completed(answered_at + FOLLOW_UP, "declined"))
        text = f"name={name.content.get('name')} color={color.content.get('color')}"
        return follow_up(now, answered_at, "Wrapping up", completed(answered_at + FOLLOW_UP, text))

    return ask_then(facts, now, questions, "Waiting for two answers", finish)


def url_consent_script(facts: Facts, now: float) -> Phase:
    question = UrlQuestion(
        "Authorize the demo at example.com to continue.", f"https://example.com/authorize?task={facts.task_id}"
    )

    def finish(answered_at: float) -> Phase:
        text = "consented" if facts.answers["consent"].action == "accept" else "declined"
        return follow_up(
            now, answered_at, "Waiting for the authorization to complete", completed(answered_at + FOLLOW_UP, text)
        )

    return ask_then(facts, now, {"consent": question}, "Waiting for consent", finish)


def fail_script(facts: Facts, now: float) -> Phase:
    return work_for(
        facts, now, SHORT_JOB, "Running (this job will fail)", lambda end: failed(end, -32603, "Simulated failure")
    )


def tool_error_script(facts: Facts, now: float) -> Phase:
    return work_for(
        facts,
        now,
        SHORT_JOB,
        "Running (this tool will report an error)",
        lambda end: completed(end, "Simulated tool error", is_error=True),
    )


def hello_script(facts: Facts, now: float) -> Phase:
    """The task `mrtr` creates once its pre-task question was answered."""
    return work_for(facts, now, FOLLOW_UP, "Saying hello", lambda end: completed(end, f"hello, {facts.args['name']}"))


# --- the conformance suite's fixture tools ----------------------------------------------------------------------


def slow_compute_script(facts: Facts, now: float) -> Phase:
    label = facts.args["label"]
    return work_for(
        facts,
        now,
        facts.args["seconds"],
        f"Computing {label}",
        lambda end: completed(end, f"Computed {label} in {facts.args['seconds']:g}s"),
    )


def failing_job_script(facts: Facts, now: float) -> Phase:
    return work_for(
        facts,
        now,
        SHORT_JOB,
        "Running the job",
        lambda end: completed(end, "Job failed: simulated tool error", is_error=True),
    )


def protocol_error_job_script(facts: Facts, now: float) -> Phase:
    return work_for(
        facts,
        now,
        FOLLOW_UP,
        "Running the job",
        lambda end: failed(end, -32603, "Internal error while running the job"),
    )


def confirm_delete_script(facts: Facts, now: float) -> Phase:
    filename = facts.args["filename"]
    question = FormQuestion(f"Delete {filename}?", {"confirm": {"type": "boolean", "title": "Confirm"}}, ("confirm",))

    def finish(answered_at: float) -> Phase:
        answer = facts.answers["confirm"]
        confirmed = answer.action == "accept" and answer.content.get("confirm") is True
        text = f"Deleted {filename}" if confirmed else f"Kept {filename}"
        return follow_up(now, answered_at, f"Deleting {filename}", completed(answered_at + FOLLOW_UP, text))

    return ask_then(facts, now, {"confirm": question}, f"Waiting for confirmation to delete {filename}", finish)


def multi_input_script(facts: Facts, now: float) -> Phase:
    questions = {
        "name": name_question("What is your name?"),
        "confirm": FormQuestion("Proceed?", {"confirm": {"type": "boolean", "title": "Proceed?"}}, ("confirm",)),
    }

    def finish(answered_at: float) -> Phase:
        name, confirm = facts.answers["name"].content.get("name"), facts.answers["confirm"].content.get("confirm")
        return follow_up(
            now, answered_at, "Wrapping up", completed(answered_at + FOLLOW_UP, f"name={name} confirm={confirm}")
        )

    return ask_then(facts, now, questions, "Waiting for two answers", finish)


def greeting_task_script(facts: Facts, now: float) -> Phase:
    """The task `test_tool_with_task` creates after its pre-task question."""
    return work_for(facts, now, FOLLOW_UP, "Greeting", lambda end: completed(end, f"Hello, {facts.args['name']}!"))


# --- a hostile tool (--hostile), for taskhub's own escaping tests ----------------------------------------------

# Each payload sets window.__taskhub_xss if a page ever interprets it as markup instead of showing it as text.
MARKUP_PAYLOADS = (
    '<img src=x onerror="window.__taskhub_xss=1">',
    "<script>window.__taskhub_xss=2</script>",
    '"><svg onload="window.__taskhub_xss=3">',
)
MARKUP = " ".join(MARKUP_PAYLOADS)


def markup_probe_script(facts: Facts, now: float) -> Phase:
    question = FormQuestion(
        f"Server says {MARKUP}",
        {
            "choice": {
                "type": "string",
                "title": f"Pick {MARKUP_PAYLOADS[0]}",
                "description": MARKUP_PAYLOADS[1],
                "oneOf": [
                    {"const": "a", "title": f"A {MARKUP_PAYLOADS[2]}"},
                    {"const": "b", "title": "B"},
                ],
            },
            "note": {"type": "string", "title": f"Note {MARKUP_PAYLOADS[1]}", "default": MARKUP_PAYLOADS[0]},
        },
        ("choice",),
    )

    def finish(answered_at: float) -> Phase:
        return follow_up(now, answered_at, f"Finishing {MARKUP}", completed(answered_at + FOLLOW_UP, f"done {MARKUP}"))

    return ask_then(facts, now, {"probe": question}, f"Working {MARKUP}", finish)


SCRIPTS: dict[str, Script] = {
    "progress": progress_script,
    "long": long_script,
    "approval": approval_script,
    "two_questions": two_questions_script,
    "url_consent": url_consent_script,
    "fail": fail_script,
    "tool_error": tool_error_script,
    "mrtr": hello_script,
    "slow_compute": slow_compute_script,
    "failing_job": failing_job_script,
    "protocol_error_job": protocol_error_job_script,
    "confirm_delete": confirm_delete_script,
    "multi_input": multi_input_script,
    "test_tool_with_task": greeting_task_script,
    "markup_probe": markup_probe_script,
}
