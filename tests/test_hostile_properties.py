"""Property test: generated `tasks/get` answers, valid and invalid mixed, served by the hostile server to the
real tracker. One server and one tracker serve every example (hypothesis runs the examples inside one
call of the test); each example follows a task of its own through a few answers, then checks:

- every rejected or suspicious answer is a `task.protocol_error` on that task (the same problem twice in a
  row once), and a clean run has none;
- the task holds what the last valid answer said, and once terminal it never changes;
- no input request key is stored twice;
- the tracker is still running and a healthy control task keeps progressing.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskhub.audit.models import AuditEvent
from taskhub.audit.services import storable
from taskhub.mcp.wire import MAX_RESPONSE_BYTES, TERMINAL_STATUSES
from taskhub.tasks.models import InputRequest, Task, TaskStatus
from taskhub.tasks.services import cap_status_message
from tests.helpers import wait_until
from tests.hostile_fixtures import Control, followed, protocol_errors, register
from tests.hostile_server import HostileServer, Raw, Reset, Result, working
from tests.tracker_fixtures import RunningTracker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {
    "request_timeout": 2.0,
    "min_interval_ms": 50,
    "backoff_base_seconds": 0.05,
    "backoff_cap_seconds": 0.2,
    "listen": False,
}


@dataclass
class Generated:
    """One answer and what it should do: `valid` answers are stored; `noted` ones too, with a protocol error."""

    answer: object
    valid: bool
    noted: bool = False
    status: str | None = None
    status_message: str | None = None
    problem: str | None = None  # which problem it causes; the same problem twice in a row is recorded once


texts = st.one_of(
    st.text(max_size=40),  # any characters, NUL and lone surrogates included
    st.sampled_from([5_000, 200_000]).map(lambda n: "m" * n),
)
FORM = {"mode": "form", "message": "Go?", "requestedSchema": {"type": "object", "properties": {}}}


@st.composite
def answers(draw, remote: str, index: int) -> Generated:
    status = draw(st.sampled_from(["working", "input_required", "completed", "failed", "cancelled"]))
    fields: dict = {"pollIntervalMs": 50}
    message = draw(st.none() | texts)
    if message is not None:
        fields["statusMessage"] = message
    # What the answer's protocol error says, as far as telling one from the next goes: the server's requests are
    # named by this answer's keys; a result out of place says only the task's status, so two such answers in a row
    # with one status are one problem (recorded once).
    noted_as = []
    if status == "input_required":
        keys = draw(st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True))
        params = draw(st.sampled_from(["good", "not an object", "bad schema"]))
        if params != "good":
            noted_as.append(f"requests of answer {index}")
        value = {"good": FORM, "not an object": ["x"], "bad schema": {**FORM, "requestedSchema": 7}}[params]
        fields["inputRequests"] = {f"{index}{key}": {"method": "elicitation/create", "params": value} for key in keys}
    if status == "completed" or (draw(st.booleans()) and draw(st.booleans())):
        fields["result"] = {"content": [{"type": "text", "text": draw(texts)}]}
        if status != "completed":
            noted_as.append(f"a {status} task carries a result")
    noted = bool(noted_as)
    if status == "failed":
        fields["error"] = {"code": draw(st.integers(-33000, 0)), "message": draw(texts)}
    valid = working(remote, status=status, **fields)
    stored_message = cap_status_message(storable(message))
    problem = "; ".join(noted_as) or None
    fine = Generated(Result(valid), True, noted=noted, status=status, status_message=stored_message, problem=problem)

    breakage = draw(st.sampled_from(["none"] * 6 + list(BREAKAGES)))
    if breakage == "none":
        return fine
    return Generated(BREAKAGES[breakage](remote, valid), valid=False, problem=breakage)


BREAKAGES = {
    "unknown status": lambda remote, valid: Result({**valid, "status": "paused"}),
    "status not a string": lambda remote, valid: Result({**valid, "status": ["working"]}),
    "message not a string": lambda remote, valid: Result({**valid, "statusMessage": {"text": "hi"}}),
    "requests not an object": lambda remote, valid: Result({**valid, "status": "input_required", "inputRequests": []}),
    "a request not an object": lambda remote, valid: Result(
        {**valid, "status": "input_required", "inputRequests": {"k": 1}}
    ),
    "asks without requests": lambda remote, valid: Result(
        {key: value for key, value in {**valid, "status": "input_required"}.items() if key != "inputRequests"}
    ),
    "a task handle": lambda remote, valid: Result({**valid, "resultType": "task"}),
    "another task": lambda remote, valid: Result({**valid, "taskId": remote + "-other"}),
    "result not an object": lambda remote, valid: Result({**valid, "status": "completed", "result": "done"}),
    "a NUL in a key": lambda remote, valid: Result(
        {**valid, "status": "input_required", "inputRequests": {"k\u0000": {"method": "elicitation/create"}}}
    ),
    "too long a timestamp": lambda remote, valid: Result({**valid, "createdAt": "9" * 100}),
    "too large": lambda remote, valid: Result({**valid, "statusMessage": "x" * (MAX_RESPONSE_BYTES + 1)}),
    "not JSON": lambda remote, valid: Raw(json.dumps(valid).encode()[:-3]),
    "reset mid-body": lambda remote, valid: Reset(valid),
}


RUN = uuid.uuid4().hex[:8]
example_numbers = itertools.count(1)


@st.composite
def scripts(draw) -> tuple[str, list[Generated]]:
    # Unique even when hypothesis replays an example: a task id is never reused on one server.
    remote = f"prop-{RUN}-{next(example_numbers)}"
    count = draw(st.integers(1, 3))
    return remote, [draw(answers(remote, index)) for index in range(count)]


@pytest.fixture(scope="module")
def hostile():
    with HostileServer() as server:
        yield server


def seen(generated: list[Generated]) -> list[Generated]:
    """The answers the tracker got to apply: none after the first valid terminal one."""
    for index, item in enumerate(generated):
        if item.valid and item.status in TERMINAL_STATUSES:
            return generated[: index + 1]
    return generated


def check_example(hostile: HostileServer, remote: str, generated: list[Generated], task: Task) -> None:
    shown = seen(generated)
    ended = shown[-1].valid and shown[-1].status in TERMINAL_STATUSES

    def processed() -> bool:
        # A task is polled again only after what its previous answer did was committed.
        if ended:
            return Task.objects.get(pk=task.pk).status in TERMINAL_STATUSES
        return hostile.polls[remote] >= len(shown) + 1

    wait_until(processed, timeout=30, what="every answer processed")

    errors = protocol_errors(task)
    problems = [item.problem for item in shown if item.problem is not None]
    distinct_in_a_row = sum(1 for i, problem in enumerate(problems) if i == 0 or problems[i - 1] != problem)
    assert len(errors) >= distinct_in_a_row, f"{problems} left only {errors}"
    if not problems:
        assert not errors, f"a clean run recorded protocol errors: {errors}"

    valid = [item for item in shown if item.valid]
    stored = Task.objects.get(pk=task.pk)
    if valid:
        assert (stored.status, stored.status_message) == (valid[-1].status, valid[-1].status_message)
    else:
        assert (stored.status, stored.status_message) == (TaskStatus.WORKING, "")

    keys = list(InputRequest.objects.filter(task=task).values_list("mrtr_round", "key"))
    assert len(keys) == len(set(keys))


def assert_terminal_tasks_never_changed(task_ids: list[uuid.UUID]) -> None:
    for task_id in task_ids:
        changes = AuditEvent.objects.filter(task_id=task_id, action__in=("task.status_changed", "task.updated"))
        statuses = [event.data.get("to") for event in changes.order_by("id") if event.action == "task.status_changed"]
        ended_at = next((i for i, status in enumerate(statuses) if status in TERMINAL_STATUSES), None)
        if ended_at is not None:
            assert ended_at == len(statuses) - 1, f"task {task_id} changed after it ended: {statuses}"
            last_end = changes.filter(action="task.status_changed").order_by("id").last()
            assert not changes.filter(id__gt=last_end.id).exists()


def test_generated_answers_keep_every_invariant(hostile):
    server = register(hostile)
    control = Control(hostile, server)
    followed_ids: list[uuid.UUID] = []

    with RunningTracker(worker_id=f"prop-{uuid.uuid4().hex[:6]}", **FAST) as running:

        @settings(
            max_examples=25,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(scripts())
        def example(script):
            remote, generated = script
            hostile.script(remote, *(item.answer for item in generated))
            task = followed(server, remote)
            followed_ids.append(task.pk)
            try:
                check_example(hostile, remote, generated, task)
            finally:
                hostile.script(remote, Result(working(remote, status="cancelled")))  # let it end

        example()
        assert running.error is None
        control.assert_progressing()
    assert_terminal_tasks_never_changed(followed_ids)
