"""The real tracker's task subscriptions against a hostile server's `notifications/tasks` (tests/hostile_server.py).

The server acknowledges `subscriptions/listen` and then sends, on the open event stream, whatever a test
pushes: invalid JSON, messages that are not JSON-RPC, wrong types, unknown statuses, 10 MB status messages,
notifications without a subscription id or about tasks that are not ours, a terminal task taken back, floods.
A bad notification about a task of ours is at most one `task.protocol_error` on its timeline; one that names
no task of ours is ignored with a log line; the task's stored state never changes, a terminal task stays
as it ended, the worker neither crashes nor stalls: a control task's notifications keep being stored.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator

import pytest

from taskhub.tasks.models import Task, TaskStatus
from tests.helpers import wait_until
from tests.hostile_fixtures import followed, new_remote_id, protocol_errors, register
from tests.hostile_server import HostileServer, Message, RawEvent, Result, working
from tests.tracker_fixtures import RunningTracker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TRACKER_OPTIONS = {"request_timeout": 3.0, "backoff_base_seconds": 0.2, "backoff_cap_seconds": 1.0, "listen": True}
TEN_MB = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with HostileServer(listening=True) as server:
        yield server


def notified(remote: str, **fields) -> dict:
    """`notifications/tasks` params: a task as `tasks/get` would give it, minus `resultType`."""
    task = working(remote, **fields)
    del task["resultType"]
    return task


def stored_message(task: Task) -> str:
    return Task.objects.get(pk=task.pk).status_message


class NotifiedControl:
    """A healthy task followed by notifications: each step is notified, and polls say the same."""

    def __init__(self, hostile: HostileServer, server) -> None:
        self.hostile = hostile
        self.remote = new_remote_id("control")
        self.step = 0
        hostile.script(self.remote, lambda n: Result(working(self.remote, statusMessage=f"step {self.step}")))
        self.task = followed(server, self.remote)

    def assert_progressing(self, steps: int = 3, timeout: float = 20) -> None:
        for _ in range(steps):
            self.step += 1
            message = f"step {self.step}"
            # Sent again until stored: a subscription a bad notification ended is opened again meanwhile.
            wait_until(
                lambda message=message: (
                    self.hostile.notify(notified(self.remote, statusMessage=message)) >= 0
                    and wait_briefly(lambda: stored_message(self.task) == message)
                ),
                timeout=timeout,
                what=f"the control task's {message} stored",
            )


def wait_briefly(condition, seconds: float = 1.0) -> bool:
    try:
        wait_until(condition, timeout=seconds, what="a brief condition")
    except AssertionError:
        return False
    return True


@pytest.fixture
def stage(hostile):
    server = register(hostile)
    control = NotifiedControl(hostile, server)
    with RunningTracker(worker_id=f"notified-{uuid.uuid4().hex[:6]}", **TRACKER_OPTIONS) as running:
        wait_until(lambda: hostile.subscribed_to(control.remote), timeout=15, what="the control subscribed")
        control.assert_progressing()
        yield server, control, running
        control.assert_progressing()
        assert running.tracker.stats.notifications > 0


def subscribed_task(hostile: HostileServer, server, what: str) -> tuple[str, Task]:
    remote = new_remote_id(what)
    hostile.script(remote, Result(working(remote, statusMessage="fine so far")))
    task = followed(server, remote)
    wait_until(lambda: hostile.subscribed_to(remote), timeout=15, what="the task subscribed")
    return remote, task


# --- one bad notification after another ------------------------------------------------------------------------


def bad(remote: str, **fields) -> dict:
    return notified(remote, **{"statusMessage": "fine so far", **fields})


ABOUT_OUR_TASK = {
    "a status message that is a number": (lambda rid: bad(rid, statusMessage=42), "statusMessage"),
    "an unknown status": (lambda rid: bad(rid, status="paused"), "unknown task status 'paused'"),
    "a status that is a list": (lambda rid: bad(rid, status=["working"]), "unknown task status"),
    "input_required without requests": (lambda rid: bad(rid, status="input_required"), "without"),
    "inputRequests that is a list": (
        lambda rid: bad(rid, status="input_required", inputRequests=[{"method": "x"}]),
        "inputRequests",
    ),
    "a createdAt far too long": (lambda rid: bad(rid, createdAt="2" * 5000), "createdAt"),
    "a result on a working task": (lambda rid: bad(rid, result={"content": []}), "result"),
}

NAMING_NO_TASK_OF_OURS = {
    "invalid JSON": lambda rid: RawEvent(b'event: message\ndata: {"jsonrpc": "2.0", "method": \n\n'),
    "a JSON array": lambda rid: Message([1, 2, 3]),
    "params that are a string": lambda rid: Message({"jsonrpc": "2.0", "method": "notifications/tasks", "params": "x"}),
    "no subscription id": lambda rid: {**notified(rid, statusMessage="unrouted"), "_meta": {}},
    "another subscription's id": lambda rid: {
        **notified(rid, statusMessage="misrouted"),
        "_meta": {"io.modelcontextprotocol/subscriptionId": "tasks-listen-nobody"},
    },
    "another task": lambda rid: notified("somebody-else", statusMessage="not yours"),
    "a task id far too long": lambda rid: notified(rid + "x" * 5000),
    "a task id that is a number": lambda rid: {**notified(rid), "taskId": 42},
    "a 10 MB status message": lambda rid: notified(rid, statusMessage="x" * TEN_MB),
}


@pytest.mark.parametrize("case", list(ABOUT_OUR_TASK))
def test_a_bad_notification_about_our_task_is_one_protocol_error(stage, hostile, case):
    server, control, _ = stage
    make, expected = ABOUT_OUR_TASK[case]
    remote, task = subscribed_task(hostile, server, "bad")
    for _ in range(3):  # the same problem again is not recorded again
        hostile.notify(make(remote))
    wait_until(lambda: protocol_errors(task), timeout=15, what="the protocol error on the timeline")
    control.assert_progressing()
    problem = json.dumps(protocol_errors(task))
    assert expected in problem and "notification" in problem, problem
    assert len(protocol_errors(task)) == 1
    stored = Task.objects.get(pk=task.pk)
    assert (stored.status, stored.status_message, stored.result) == (TaskStatus.WORKING, "fine so far", None)


@pytest.mark.parametrize("case", list(NAMING_NO_TASK_OF_OURS))
def test_a_notification_naming_no_task_of_ours_is_ignored_with_a_log_line(stage, hostile, case, caplog):
    caplog.set_level(logging.INFO)
    server, control, _ = stage
    remote, task = subscribed_task(hostile, server, "bystander")
    hostile.notify(NAMING_NO_TASK_OF_OURS[case](remote))
    control.assert_progressing()
    assert not protocol_errors(task)
    assert stored_message(task) == "fine so far"
    assert Task.objects.get(pk=task.pk).status == TaskStatus.WORKING
    ignored = [r.getMessage() for r in caplog.records if r.name.startswith(("taskhub", "mcp"))]
    assert any(word in line for line in ignored for word in ("notification", "subscription")), ignored


# --- terminal, floods -------------------------------------------------------------------------------------------


def test_a_terminal_task_taken_back_by_a_notification_never_changes(stage, hostile):
    server, control, _ = stage
    remote, task = subscribed_task(hostile, server, "undead")
    done = notified(remote, status="completed", result={"content": [{"type": "text", "text": "done"}]})
    hostile.script(remote, Result({**done, "resultType": "complete"}))
    hostile.notify(done)
    wait_until(lambda: Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED, timeout=15, what="completed")
    before = Task.objects.values().get(pk=task.pk)
    hostile.notify(notified(remote, statusMessage="back to work"), notified(remote, status="failed"))
    control.assert_progressing()
    after = Task.objects.values().get(pk=task.pk)
    assert after == before
    assert len(protocol_errors(task)) <= 1


FLOOD = 2000


def test_a_flood_of_notifications_is_stored_coalesced_and_its_last_word_kept(stage, hostile):
    server, control, running = stage
    remote, task = subscribed_task(hostile, server, "flood")
    changes_before = running.tracker.stats.changes
    flood = [notified(remote, statusMessage=f"chatter {n}") for n in range(FLOOD)]
    flood.append(notified(remote, status="completed", result={"content": [{"type": "text", "text": "done"}]}))
    # After the last word, more chatter and a taking back: neither may replace it.
    flood += [notified(remote, statusMessage="after the end"), notified(remote, status="failed")]
    hostile.notify(*flood)
    # The SDK reads a few hundred notifications a second here (fewer under load).
    wait_until(
        lambda: Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED, timeout=60, what="the last word stored"
    )
    stored_snapshots = running.tracker.stats.changes - changes_before
    assert stored_snapshots < FLOOD / 2, "a reader slower than the flood gets the latest snapshot, not every one"
    control.assert_progressing(timeout=40)
    assert Task.objects.get(pk=task.pk).result == {"content": [{"type": "text", "text": "done"}]}
