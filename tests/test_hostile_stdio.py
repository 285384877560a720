"""The real tracker against a hostile stdio MCP server (tests/hostile_stdio_server.py), a real subprocess.

A line that is not JSON-RPC, an over-long line, half a message then a closed stdout or an exit, a flood on
stderr: each bad answer is a `task.protocol_error` on the task's timeline (or an outage, when the process is
gone), promptly rather than at the request timeout, and a healthy control task on the same process keeps
progressing (a broken process is replaced by a fresh one). What the server writes on stderr reaches the
worker's log capped and with the server's configured environment values blanked out.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from pathlib import Path

import pytest

from taskhub.mcp.stdio import STDERR_LOG_MAX_BYTES
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskPoll, TaskStatus
from tests.helpers import wait_until
from tests.hostile_fixtures import followed, new_remote_id, protocol_errors, step_of
from tests.tracker_fixtures import RunningTracker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVER_SCRIPT = str(Path(__file__).with_name("hostile_stdio_server.py"))
REQUEST_TIMEOUT = 8.0  # long, so that a prompt error is told apart from a timeout
TRACKER_OPTIONS = {
    "request_timeout": REQUEST_TIMEOUT,
    "backoff_base_seconds": 0.2,
    "backoff_cap_seconds": 1.0,
    "listen": False,
}
SECRET = "stdio-secret-5e1f-must-not-be-logged"


def register(**env: str) -> Server:
    return create_server(
        name=f"hostile stdio {uuid.uuid4().hex[:6]}",
        transport="stdio",
        command=sys.executable,
        args=[SERVER_SCRIPT],
        env={"API_TOKEN": SECRET, **env},
        user=None,
    )


class Control:
    def __init__(self, server: Server) -> None:
        self.task = followed(server, new_remote_id("control"))

    def assert_progressing(self, steps: int = 3) -> None:
        start = step_of(self.task)
        wait_until(lambda: step_of(self.task) >= start + steps, timeout=20, what="the control task to progress")


@pytest.fixture
def stage():
    server = register()
    control = Control(server)
    with RunningTracker(worker_id=f"hostile-stdio-{uuid.uuid4().hex[:6]}", **TRACKER_OPTIONS) as running:
        control.assert_progressing()
        yield server, control
        control.assert_progressing()
        assert running.tracker.stats.polls > 0


BAD_LINES = {
    "garbage": "not JSON-RPC",
    "notrpc": "not JSON-RPC",
    "long": "longer than",
    "othertask": "another task",
    "wrongid": "was not sent",
    "noresult": "without result",
    "array": "not JSON-RPC",
    "badutf8": "not JSON-RPC",
    "deep": "not JSON-RPC",
}


@pytest.mark.parametrize("kind", list(BAD_LINES))
def test_a_bad_line_is_a_prompt_protocol_error(stage, kind):
    server, _ = stage
    task = followed(server, new_remote_id(kind))
    started = time.monotonic()
    wait_until(lambda: protocol_errors(task), timeout=REQUEST_TIMEOUT * 3, what="the protocol error on the timeline")
    assert time.monotonic() - started < REQUEST_TIMEOUT, "recorded before the request timeout, not as a timeout"
    problem = json.dumps(protocol_errors(task)[0])
    assert BAD_LINES[kind] in problem, problem
    assert len(problem) < 2000
    assert Task.objects.get(pk=task.pk).status == TaskStatus.WORKING
    assert len(protocol_errors(task)) == 1, "the same problem in a row is recorded once"


def test_an_input_request_whose_schema_is_no_object_schema_is_noted(stage):
    server, _ = stage
    task = followed(server, new_remote_id("badschema"))
    wait_until(lambda: protocol_errors(task), timeout=REQUEST_TIMEOUT * 3, what="the protocol error on the timeline")
    assert "schema" in json.dumps(protocol_errors(task))
    # Opened all the same (as over HTTP), so that an approver can decline or cancel it: no form is shown for it.
    request = InputRequest.objects.get(task=task)
    assert request.state == InputRequestState.OPEN


@pytest.mark.parametrize("kind", ["cut", "exit"])
def test_a_message_cut_off_is_noted_and_a_fresh_process_takes_over(stage, kind):
    server, _ = stage
    task = followed(server, new_remote_id(kind))
    started = time.monotonic()
    wait_until(
        lambda: Server.objects.get(pk=server.pk).unreachable_since is not None or protocol_errors(task),
        timeout=REQUEST_TIMEOUT * 3,
        what="the broken process noticed",
    )
    assert time.monotonic() - started < REQUEST_TIMEOUT, "noticed before the request timeout"
    assert Task.objects.get(pk=task.pk).status == TaskStatus.WORKING
    # Every fresh process dies on this task's next poll, so the others on the same server wait meanwhile
    # (a server whose process dies is down); once it is no longer polled, the control goes on (the fixture).
    TaskPoll.objects.filter(task_id=task.pk).delete()


def test_stderr_is_logged_capped_and_without_the_servers_secrets(caplog):
    caplog.set_level(logging.DEBUG)
    server = register(HOSTILE_PRINT_ENV="1", HOSTILE_STDERR_MB="5")
    control = Control(server)
    with RunningTracker(worker_id=f"hostile-stdio-{uuid.uuid4().hex[:6]}", **TRACKER_OPTIONS):
        control.assert_progressing()
        task = followed(server, new_remote_id("stderr"))
        wait_until(lambda: Task.objects.get(pk=task.pk).status_message == "loud", timeout=30, what="the loud answer")
        control.assert_progressing()
    stderr_records = [record for record in caplog.records if record.name == "taskhub.mcp.stderr"]
    logged = "\n".join(record.getMessage() for record in stderr_records)
    assert "debug: starting with" in logged, "the server's stderr reached the log"
    assert SECRET not in logged and SECRET not in "\n".join(r.getMessage() for r in caplog.records)
    assert "[redacted]" in logged
    assert len(logged) < STDERR_LOG_MAX_BYTES + 5000, "5 MB of stderr was logged capped"
    assert "stderr output dropped" in logged
