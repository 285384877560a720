"""`python -m taskhub.mcp` as a real subprocess against the real demo server (HTTP and stdio)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import pty
import re
import select
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskhub.mcp.cli import TerminalPrompter, clean_text, main, poll_interval
from taskhub.mcp.wire import DEFAULT_POLL_INTERVAL_MS, MAX_POLL_INTERVAL_MS, MIN_POLL_INTERVAL_MS, TaskSnapshot
from taskhub.worker.tracker import polling
from tests.demo_process import demo_command, demo_env
from tests.helpers import free_port
from tests.hostile_server import HostileServer, Raw, Result, working

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEMO_OPTIONS = ["--poll-interval-ms", "100"]
FAST_PROGRESS = json.dumps({"steps": 3, "step_ms": 100})
APPROVE = json.dumps({"action": "accept", "content": {"approved": True, "reason": "ok"}})
CONTRACT_TOOLS = {"quick", "progress", "approval", "two_questions", "url_consent", "fail", "tool_error", "long", "mrtr"}


@pytest.fixture(scope="module")
def demo_url(shared_demo_server) -> str:
    return shared_demo_server.url


def run_cli(*arguments: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskhub.mcp", *arguments],
        cwd=PROJECT_DIR,
        env=demo_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli_in_this_process(capsys: pytest.CaptureFixture[str], *arguments: str) -> subprocess.CompletedProcess[str]:
    """The command's `main` in the test's own process: for the many cases that test how the client takes a server's
    reply, not how the command starts (the tests above run it as a subprocess), two seconds of start-up each saved."""
    capsys.readouterr()
    status = main(list(arguments))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "taskhub.mcp", *arguments], status, out, err)


def call(url: str, tool: str, *options: str) -> subprocess.CompletedProcess[str]:
    return run_cli("call", "--url", url, tool, "--timeout", "45", *options)


def json_events(completed: subprocess.CompletedProcess[str]) -> list[dict]:
    return [json.loads(line) for line in completed.stdout.splitlines()]


def demo_stats(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/mcp") + "/demo/stats", timeout=10) as response:
        return json.load(response)


# --- exit status --------------------------------------------------------------------------------------


def test_progress_completes_with_status_lines(demo_url: str) -> None:
    completed = call(demo_url, "progress", "--args", FAST_PROGRESS)
    assert completed.returncode == 0, completed.stderr
    assert "status: working" in completed.stdout
    assert "server says “step 1 of 3”" in completed.stdout
    assert completed.stdout.rstrip().endswith("finished 3 steps")


def test_synchronous_result_maps_to_zero(demo_url: str) -> None:
    completed = call(demo_url, "quick", "--args", '{"text": "hi"}', "--json")
    assert completed.returncode == 0, completed.stderr
    (outcome,) = json_events(completed)
    assert outcome == {
        "event": "outcome",
        "status": "completed",
        "taskId": None,
        "result": {"content": [{"type": "text", "text": "echo: hi"}], "isError": False},
    }


def test_tool_error_exits_one(demo_url: str) -> None:
    completed = call(demo_url, "tool_error")
    assert completed.returncode == 1, completed.stderr
    assert "Simulated tool error" in completed.stdout


def test_failed_task_exits_two(demo_url: str) -> None:
    completed = call(demo_url, "fail", "--json")
    assert completed.returncode == 2, completed.stderr
    outcome = json_events(completed)[-1]
    assert outcome["status"] == "failed"
    assert outcome["error"] == {"code": -32603, "message": "Simulated failure"}


def test_cancel_after_exits_three(demo_url: str) -> None:
    completed = call(demo_url, "long", "--args", '{"seconds": 30}', "--cancel-after", "0.5", "--json")
    assert completed.returncode == 3, completed.stderr
    events = json_events(completed)
    names = [event["event"] for event in events]
    assert names.count("cancel_sent") == 1
    assert names.index("cancel_sent") < len(names) - 1
    assert events[-1] == {"event": "outcome", "status": "cancelled", "taskId": events[0]["taskId"]}
    assert demo_stats(demo_url)["cancels"][events[0]["taskId"]] == 1


def test_unreachable_server_exits_four() -> None:
    completed = run_cli("call", "--url", f"http://127.0.0.1:{free_port()}/mcp", "progress")
    assert completed.returncode == 4
    assert completed.stdout == ""
    (message,) = completed.stderr.splitlines()
    assert message.startswith("taskhub.mcp: TransportError: ")


BAD_OPTIONS = [
    ["--args", "{not json"],
    ["--args", "[1, 2]"],
    ["--answer", "approve={oops"],
    ["--answer", "no-equals-sign"],
    ["--answers-file", "/nonexistent/answers.json"],
    ["--header", "no colon"],
    ["--cancel-after", "soon"],
    ["--stdio", "python", "--url", "http://127.0.0.1:1/mcp"],
]


def test_bad_arguments_exit_five(demo_url: str) -> None:
    completed = call(demo_url, "progress", "--args", "{not json")
    assert (completed.returncode, completed.stdout) == (5, "")
    assert "--args is not valid JSON" in completed.stderr


def test_arguments_that_do_not_fit_the_listed_schema_exit_five_before_the_call(demo_url: str) -> None:
    """`--args` are checked against the tool's inputSchema (as tools/list gives it) in the web forms' words."""
    completed = call(demo_url, "progress", "--args", json.dumps({"steps": 0, "step_ms": "fast"}), "--json")
    assert completed.returncode == 5
    assert [event["status"] for event in json_events(completed)] == ["error"]  # no task was created
    assert "step_ms: must be a whole number; steps: must be at least 1" in completed.stderr


@pytest.mark.parametrize("options", BAD_OPTIONS)
def test_bad_arguments_are_refused_before_connecting(options: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # In-process, to spare an interpreter start per case. The port is closed: connecting would exit 4, not 5.
    assert main_exit_status(["call", "--url", "http://127.0.0.1:1/mcp", "progress", *options]) == 5
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error" in captured.err


def main_exit_status(argv: list[str]) -> int | str | None:
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse's own errors
        return exit_.code


def test_http_only_options_with_stdio_exit_five() -> None:
    completed = run_cli("call", "--stdio", "whatever", "--bearer", "token", "progress")
    assert completed.returncode == 5
    assert "--url only" in completed.stderr


def test_timeout_gives_up_and_names_the_task(demo_url: str) -> None:
    completed = run_cli("call", "--url", demo_url, "long", "--timeout", "1", "--json")
    assert completed.returncode == 4
    events = json_events(completed)
    assert events[-1]["error"]["kind"] == "RequestTimeout"
    assert f"task {events[0]['taskId']} keeps running" in completed.stderr


def test_bearer_token_and_headers(shared_demo_server_requiring_token) -> None:
    url = shared_demo_server_requiring_token.url
    quick = ["call", "--url", url, "quick", "--args", '{"text": "in"}', "--timeout", "30"]
    refused = run_cli(*quick)
    by_bearer = run_cli(*quick, "--bearer", "s3cret")
    by_header = run_cli(*quick, "--header", "Authorization: Bearer s3cret")
    assert refused.returncode == 4
    assert (by_bearer.returncode, by_bearer.stdout) == (0, "echo: in\n")
    assert (by_header.returncode, by_header.stdout) == (0, "echo: in\n")


# --- answering input ----------------------------------------------------------------------------------


def test_approval_answered_from_the_command_line(demo_url: str) -> None:
    completed = call(demo_url, "approval", "--answer", f"approve={APPROVE}")
    assert completed.returncode == 0, completed.stderr
    assert "input required [approve]" in completed.stdout
    assert "answered [approve] (accept)" in completed.stdout
    assert completed.stdout.rstrip().endswith("approved: deploy (reason: ok)")


def test_each_key_is_delivered_once(demo_url: str) -> None:
    completed = call(demo_url, "approval", "--args", '{"action": "ship"}', "--answer", f"approve={APPROVE}", "--json")
    assert completed.returncode == 0, completed.stderr
    task_id = json_events(completed)[0]["taskId"]
    assert demo_stats(demo_url)["deliveries"][f"{task_id}/approve"] == 1


def test_missing_answer_without_a_terminal_exits_five(demo_url: str) -> None:
    completed = call(demo_url, "approval", "--json")
    assert completed.returncode == 5
    events = json_events(completed)
    assert events[-1]["event"] == "outcome"
    assert events[-1]["exitStatus"] == 5
    assert "stdin is not a terminal" in completed.stderr
    assert "--answer approve=" in completed.stderr


def test_two_questions_from_an_answers_file(demo_url: str, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(
        json.dumps(
            {
                "name": {"action": "accept", "content": {"name": "Ada"}},
                "color": {"action": "accept", "content": {"color": "green"}},
            }
        )
    )
    completed = call(demo_url, "two_questions", "--answers-file", str(answers), "--json")
    assert completed.returncode == 0, completed.stderr
    events = json_events(completed)
    assert sorted(event["key"] for event in events if event["event"] == "answered") == ["color", "name"]
    assert events[-1]["result"]["content"] == [{"type": "text", "text": "name=Ada color=green"}]


def test_wildcard_answer_and_url_shown_in_full(demo_url: str) -> None:
    completed = call(demo_url, "url_consent", "--answer", '*={"action": "accept"}')
    assert completed.returncode == 0, completed.stderr
    assert "URL: https://example.com/authorize?task=" in completed.stdout
    assert completed.stdout.rstrip().endswith("consented")


def test_mrtr_round_then_task(demo_url: str) -> None:
    answer = json.dumps({"action": "accept", "content": {"name": "Ada"}})
    completed = call(demo_url, "mrtr", "--answer", f"name={answer}", "--json")
    assert completed.returncode == 0, completed.stderr
    events = json_events(completed)
    assert [event["event"] for event in events[:2]] == ["input_required", "answered"]
    assert events[0]["taskId"] is None
    assert events[2]["event"] == "task_created"
    assert events[-1]["result"]["content"] == [{"type": "text", "text": "hello, Ada"}]


def test_answer_typed_on_a_terminal(demo_url: str) -> None:
    """With stdin a terminal, the form is asked field by field: accept, approved? yes, reason."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "taskhub.mcp", "call", "--url", demo_url, "approval", "--timeout", "45"],
        cwd=PROJECT_DIR,
        env=demo_env(),
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
    )
    os.close(terminal)
    try:
        prompts = read_until(controller, "respond?")
        assert "Approve?" not in prompts
        os.write(controller, b"a\n")
        read_until(controller, "Approve?")
        os.write(controller, b"yes\n")
        read_until(controller, "Reason")
        os.write(controller, b"typed\n")
        stdout, _ = process.communicate(timeout=30)
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert stdout.rstrip().endswith("approved: deploy (reason: typed)")


def prompted(monkeypatch: pytest.MonkeyPatch, request: dict, typed: str) -> tuple[dict, str]:
    """TerminalPrompter in-process: `typed` is what the person types; returns the response and what was said."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
    said = io.StringIO()
    response = asyncio.run(TerminalPrompter(server="demo", err=said).ask("k", request))
    return response, said.getvalue()


def test_a_typed_value_that_does_not_fit_is_asked_again_in_the_web_forms_words(monkeypatch) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}, "required": ["n"]}
    request = {"method": "elicitation/create", "params": {"message": "How many?", "requestedSchema": schema}}
    response, said = prompted(monkeypatch, request, "a\n2.5\n9\n\n4.0\n")
    assert response == {"action": "accept", "content": {"n": 4}}
    assert re.findall(r"must be [^\n]*|this field is required", said) == [
        "must be a whole number",
        "must be at most 5",
        "this field is required",
    ]


def test_a_form_the_terminal_cannot_show_may_only_be_declined_or_cancelled(monkeypatch) -> None:
    schema = {"type": "object", "properties": {"where": {"type": "object"}}, "required": ["where"]}
    request = {"method": "elicitation/create", "params": {"message": "Where?", "requestedSchema": schema}}
    response, said = prompted(monkeypatch, request, "a\n\nd\n")
    assert response == {"action": "decline"}
    assert "cannot be filled in" in said and "type object" in said


def read_until(fd: int, marker: str, timeout: float = 20) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {marker!r} on the terminal; saw {seen!r}")
        seen += os.read(fd, 4096).decode(errors="replace")
    return seen


# --- following ----------------------------------------------------------------------------------------


def test_listen_follows_by_notifications(demo_url: str) -> None:
    completed = call(demo_url, "progress", "--args", json.dumps({"steps": 4, "step_ms": 300}), "--listen", "--json")
    assert completed.returncode == 0, completed.stderr
    events = json_events(completed)
    messages = [event["statusMessage"] for event in events if event["event"] == "status"]
    assert "step 2 of 4" in messages
    # One resync after the acknowledgement; everything else came as notifications.
    assert demo_stats(demo_url)["polls"].get(events[0]["taskId"], 0) <= 1


def test_json_event_stream_shape(demo_url: str) -> None:
    completed = call(demo_url, "progress", "--args", FAST_PROGRESS, "--json")
    assert completed.returncode == 0, completed.stderr
    events = json_events(completed)
    created, *middle, outcome = events
    assert created["event"] == "task_created"
    assert created["status"] == "working"
    assert {event["event"] for event in middle} == {"status"}
    assert [event["status"] for event in middle][-1] == "completed"
    assert all(event["taskId"] == created["taskId"] for event in middle)
    assert outcome == {
        "event": "outcome",
        "status": "completed",
        "taskId": created["taskId"],
        "result": {"content": [{"type": "text", "text": "finished 3 steps"}], "isError": False},
    }


def test_polling_honours_the_poll_interval(demo_url: str) -> None:
    completed = call(demo_url, "progress", "--args", json.dumps({"steps": 5, "step_ms": 200}), "--json")
    assert completed.returncode == 0, completed.stderr
    polls = demo_stats(demo_url)["polls"][json_events(completed)[0]["taskId"]]
    # About 1 s of work at 100 ms intervals: ~10 polls, never a busy loop.
    assert 2 <= polls <= 15


def test_stdio_server() -> None:
    server = shlex.join(demo_command("stdio", *DEMO_OPTIONS))
    completed = run_cli("call", "--stdio", server, "progress", "--args", FAST_PROGRESS, "--timeout", "45")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.rstrip().endswith("finished 3 steps")


# --- discover -----------------------------------------------------------------------------------------


def test_discover_json(demo_url: str) -> None:
    completed = run_cli("discover", "--url", demo_url, "--json")
    assert completed.returncode == 0, completed.stderr
    (line,) = completed.stdout.splitlines()
    document = json.loads(line)
    assert set(document) == {"discover", "tools", "protocolVersion"}
    assert document["protocolVersion"] == "2026-07-28"
    assert "io.modelcontextprotocol/tasks" in document["discover"]["capabilities"]["extensions"]
    assert {tool["name"] for tool in document["tools"]} == CONTRACT_TOOLS
    assert document["tools"] == raw_tools_list(demo_url)


def raw_tools_list(url: str) -> list[dict]:
    """The tool list straight off the wire, to hold the CLI's copy against."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/list",
    }
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as response:
        answer = json.load(response)
    assert "nextCursor" not in answer["result"]
    return answer["result"]["tools"]


def test_a_reader_that_goes_away_ends_the_command_quietly(demo_url: str) -> None:
    reading = subprocess.Popen(
        [sys.executable, "-m", "taskhub.mcp", "discover", "--url", demo_url],
        cwd=PROJECT_DIR,
        env=demo_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    reading.stdout.close()  # as `… | head` does once it has its lines: long before the command writes any
    _, stderr = reading.communicate(timeout=60)
    assert reading.returncode == 141, stderr
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr, stderr


def test_discover_human(demo_url: str) -> None:
    completed = run_cli("discover", "--url", demo_url)
    assert completed.returncode == 0, completed.stderr
    assert "protocol version: 2026-07-28" in completed.stdout
    assert "extensions: io.modelcontextprotocol/tasks" in completed.stdout
    assert "  approval — " in completed.stdout


# --- untrusted text -----------------------------------------------------------------------------------


def test_clean_text_strips_escapes_and_controls() -> None:
    hostile = "ok\x1b[2J\x1b]0;title\x07\x1b]8;;http://x\x1b\\link\r\nnext\u202eevil\x00\x9b31m"
    assert clean_text(hostile) == "oklink nextevil"
    assert clean_text(hostile, multiline=True) == "oklink\nnextevil"
    assert clean_text("x" * 500, cap=10).startswith("xxxxxxxxxx… [490 more characters")


# --- replies checked against their requests (hostile servers) ---------------------------------------------

HOSTILE_STDIO_SERVER = shlex.join([sys.executable, str(PROJECT_DIR / "tests" / "hostile_stdio_server.py")])
NESTED = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with HostileServer() as server:
        yield server


def reply(request_id: Any, result: bytes) -> bytes:
    return b'{"jsonrpc": "2.0", "id": ' + json.dumps(request_id).encode() + b', "result": ' + result + b"}"


HOSTILE_REPLIES = {
    "a snapshot of another task": (lambda rid: Result(working("somebody-else")), "another task"),
    "a reply under another JSON-RPC id": (
        lambda rid: Raw(lambda request_id: reply(f"not-{request_id}", json.dumps(working(rid)).encode())),
        "tasks/get",
    ),
    "an event stream answering another JSON-RPC id": (
        lambda rid: Raw(
            lambda request_id: (
                b"event: message\ndata: " + reply(f"not-{request_id}", json.dumps(working(rid)).encode()) + b"\n\n"
            ),
            "text/event-stream",
        ),
        "tasks/get",
    ),
    "a completed task without result": (lambda rid: Result(working(rid, status="completed")), "without"),
    "a JSON array": (lambda rid: Raw(b"[1, 2, 3]"), "tasks/get"),
    "a JSON string": (lambda rid: Raw(b'"working"'), "tasks/get"),
    "an object that is not JSON-RPC": (lambda rid: Raw(b'{"hello": "world"}'), "tasks/get"),
    "invalid UTF-8": (
        lambda rid: Raw(lambda request_id: reply(request_id, b'{"taskId": "' + rid.encode() + b'\xff\xfe"}')),
        "tasks/get",
    ),
    "absurd nesting": (lambda rid: Raw(lambda request_id: reply(request_id, NESTED)), "tasks/get"),
    "a 10 MB status message": (lambda rid: Result(working(rid, statusMessage="x" * (10 * 1024 * 1024))), "larger"),
    "a requestedSchema that is not an object schema": (
        lambda rid: Result(
            working(
                rid,
                status="input_required",
                inputRequests={"k": {"method": "elicitation/create", "params": {"requestedSchema": "yes"}}},
            )
        ),
        "requestedSchema",
    ),
    "a requestedSchema of a string": (
        lambda rid: Result(
            working(
                rid,
                status="input_required",
                inputRequests={
                    "k": {
                        "method": "elicitation/create",
                        "params": {"message": "?", "requestedSchema": {"type": "string"}},
                    }
                },
            )
        ),
        "requestedSchema",
    ),
}


def assert_one_protocol_error(completed: subprocess.CompletedProcess[str], expected: str) -> None:
    assert completed.returncode == 4, (completed.returncode, completed.stdout, completed.stderr)
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert "Traceback" not in completed.stderr and "pydantic" not in completed.stderr.lower()
    assert expected in lines[0], lines[0]
    assert "outcome" not in completed.stdout and "status: completed" not in completed.stdout


@pytest.mark.parametrize("case", list(HOSTILE_REPLIES))
def test_a_hostile_reply_over_http_is_one_protocol_error(
    hostile: HostileServer, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make_answer, expected = HOSTILE_REPLIES[case]
    remote = f"cli-{uuid.uuid4().hex[:10]}"
    tool = f"tool-{remote}"
    hostile.tool(tool, Result({"resultType": "task", "taskId": remote, "status": "working", "pollIntervalMs": 50}))
    hostile.script(remote, make_answer(remote))
    completed = run_cli_in_this_process(
        capsys,
        "call",
        "--url",
        hostile.url,
        tool,
        "--timeout",
        "20",
        "--answer",
        '*={"action": "accept", "content": {}}',
    )
    assert_one_protocol_error(completed, expected)
    assert hostile.polls[remote] >= 1


STDIO_REPLIES = {
    "othertask": "another task",
    "wrongid": "tasks/get",
    "noresult": "without",
    "array": "tasks/get",
    "badutf8": "tasks/get",
    "deep": "tasks/get",
    "badschema": "requestedSchema",
}


@pytest.mark.parametrize("kind", list(STDIO_REPLIES))
def test_a_hostile_reply_over_stdio_is_one_protocol_error(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    arguments = json.dumps({"taskId": f"{kind}-{uuid.uuid4().hex[:8]}"})
    completed = run_cli_in_this_process(
        capsys,
        "call",
        "--stdio",
        HOSTILE_STDIO_SERVER,
        "work",
        "--args",
        arguments,
        "--timeout",
        "120",
        "--answer",
        '*={"action": "accept", "content": {}}',
    )
    assert_one_protocol_error(completed, STDIO_REPLIES[kind])
    # The bad reply itself is the error, at once: not a request left waiting until the timeout gave up on it.
    assert "no answer within" not in completed.stderr and "gave up after" not in completed.stderr, completed.stderr


def test_a_cancel_the_server_never_confirms_is_waited_for_a_bounded_time(hostile: HostileServer) -> None:
    remote = f"cli-endless-{uuid.uuid4().hex[:10]}"
    tool = f"tool-{remote}"
    hostile.tool(tool, Result({"resultType": "task", "taskId": remote, "status": "working", "pollIntervalMs": 50}))
    hostile.script(remote, Result(working(remote, pollIntervalMs=50)))
    started = time.monotonic()
    completed = run_cli("call", "--url", hostile.url, tool, "--cancel-after", "0.2", "--cancel-wait", "1.5", timeout=30)
    assert completed.returncode == 3, (completed.stdout, completed.stderr)
    assert time.monotonic() - started < 20
    assert remote in hostile.cancels
    assert "did not confirm" in completed.stderr and "Traceback" not in completed.stderr


def test_a_cancel_over_stdio_the_server_never_confirms_is_waited_for_a_bounded_time() -> None:
    arguments = json.dumps({"taskId": f"endless-{uuid.uuid4().hex[:8]}"})
    completed = run_cli(
        "call",
        "--stdio",
        HOSTILE_STDIO_SERVER,
        "work",
        "--args",
        arguments,
        "--cancel-after",
        "0.2",
        "--cancel-wait",
        "1.5",
        timeout=30,
    )
    assert completed.returncode == 3, (completed.stdout, completed.stderr)
    assert "did not confirm" in completed.stderr


def test_the_poll_interval_is_clamped_as_the_tracker_clamps_it() -> None:
    def interval(ms: int | None) -> float:
        return poll_interval(TaskSnapshot.model_validate({"taskId": "t", "status": "working", "pollIntervalMs": ms}))

    assert interval(10**12) == MAX_POLL_INTERVAL_MS / 1000
    assert interval(1) == MIN_POLL_INTERVAL_MS / 1000
    assert interval(None) == DEFAULT_POLL_INTERVAL_MS / 1000
    assert (polling.MIN_POLL_INTERVAL_MS, polling.MAX_POLL_INTERVAL_MS) == (MIN_POLL_INTERVAL_MS, MAX_POLL_INTERVAL_MS)


def test_a_classic_elicitation_of_the_reference_server_is_answered_with_the_forms_defaults(everything) -> None:
    """Issue 32 item 5: a question asked in the middle of the call (2025-11-25 `elicitation/create`, over stdio) is
    answered from --answer, the fields it leaves out taking the form's defaults (SEP-1034); without an answer and a
    terminal the command says which key to pass and exits 5."""
    server = f"{shutil.which('node') or 'node'} {everything} stdio"
    answer = '*={"action": "accept", "content": {"name": "Ada"}}'
    answered = run_cli("call", "--stdio", server, "trigger-elicitation-request", "--answer", answer, "--timeout", "45")
    assert answered.returncode == 0, answered.stderr
    for line in ("User provided the requested information!", "- Name: Ada", "- Favorite Integer: 42"):
        assert line in answered.stdout, answered.stdout
    assert '"untitledMultipleSelectEnum": [\n      "Guitar"\n    ]' in answered.stdout
    assert "answered [call:" in answered.stderr + answered.stdout

    unanswered = run_cli("call", "--stdio", server, "trigger-elicitation-request", "--timeout", "45")
    assert unanswered.returncode == 5, unanswered.stderr
    assert "stdin is not a terminal; pass --answer call:" in unanswered.stderr
