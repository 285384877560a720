"""Issue 32 item 4 (progress): `notifications/progress` of a call in flight reaches the task, at a bounded rate.

The official reference server's `trigger-long-running-operation` reports a step a second while its tools/call
waits; through a `manage.py worker` the task carries each step (and its total) while it runs, and the result at the
end. A server's nonsense (NaN, negative, past any count, a message too long or unstorable) is not shown, and a task
that ended takes no more.
"""

from __future__ import annotations

import math
import time

import pytest

from taskhub.accounts.groups import ADMINS
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import Task, TaskStatus
from taskhub.tasks.services.progress import PROGRESS_MESSAGE_MAX_CHARS, record_progress
from tests.account_fixtures import make_user
from tests.everything_fixtures import register_everything

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_the_steps_of_a_long_call_reach_the_task_while_it_runs(workers, everything):
    admin = make_user("ada", ADMINS)
    server = register_everything(admin, everything, expect_tool="trigger-long-running-operation")
    workers.start("progress")
    task = services.launch(
        server=server, tool="trigger-long-running-operation", arguments={"duration": 4, "steps": 4}, user=admin
    )
    seen: list[tuple[float, float | None]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = Task.objects.values("status", "progress", "progress_total").get(pk=task.pk)
        if now["status"] == TaskStatus.COMPLETED:
            break
        if now["progress"] is not None and (not seen or seen[-1] != (now["progress"], now["progress_total"])):
            seen.append((now["progress"], now["progress_total"]))
        time.sleep(0.05)
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED, (task.status, task.error)
    assert "Long running operation completed" in task.result["content"][0]["text"]
    assert len(seen) >= 2, seen  # seen to move while the call ran, not only at its end
    assert [total for _, total in seen] == [4.0] * len(seen)
    assert [progress for progress, _ in seen] == sorted(progress for progress, _ in seen)
    assert not task.shows_progress  # over: no bar


def test_a_servers_nonsense_progress_is_not_shown_and_an_ended_task_takes_none(admin_task):
    for progress, total in ((math.nan, None), (-1, None), (math.inf, 10), (1, 0), (1, -5), (1e16, None), (1, math.nan)):
        assert not record_progress(task_id=admin_task.pk, progress=progress, total=total, message="x"), (
            progress,
            total,
        )
    assert record_progress(task_id=admin_task.pk, progress=3, total=10, message="é" * 900 + "\x00")
    admin_task.refresh_from_db()
    assert (admin_task.progress, admin_task.progress_total, admin_task.progress_words) == (3, 10, "3 of 10")
    assert len(admin_task.progress_message) == PROGRESS_MESSAGE_MAX_CHARS and "\x00" not in admin_task.progress_message
    Task.objects.filter(pk=admin_task.pk).update(status=TaskStatus.COMPLETED)
    assert not record_progress(task_id=admin_task.pk, progress=4, total=10, message=None)


@pytest.fixture
def admin_task():
    admin = make_user("ada", ADMINS)
    server = create_server(name="somewhere", transport="http", url="http://127.0.0.1:9/mcp", user=admin)
    return Task.objects.create(server=server, tool="t", arguments={}, launched_by=admin)
