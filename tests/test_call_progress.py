"""Issue 32 item 4 (progress): `notifications/progress` of a call in flight reaches the task, at a bounded rate.

The official reference server's `trigger-long-running-operation` reports a step a second while its tools/call
waits; through a `manage.py worker` the task carries each step (and its total) while it runs, and the result at the
end. A server's nonsense (NaN, negative, past any count, a message too long or unstorable) is not shown, and a task
that ended takes no more.
"""

from __future__ import annotations

import math
import re
import time

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.utils import timezone

from taskhub.accounts.groups import ADMINS
from taskhub.audit.models import AuditEvent
from taskhub.servers.services import create_server
from taskhub.tasks import presenters, services
from taskhub.tasks.models import ServerLogLine, Task, TaskStatus
from taskhub.tasks.services.progress import (
    PROGRESS_MESSAGE_MAX_CHARS,
    SERVER_LOG_LINES_KEPT,
    SERVER_LOG_TEXT_MAX_CHARS,
    LogLine,
    record_progress,
    record_server_log,
)
from taskhub.worker.progress import LOG_BURST, CallLog
from tests.account_fixtures import make_user
from tests.everything_fixtures import register_everything
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_the_steps_and_log_lines_of_a_long_call_reach_the_task_while_it_runs(workers, everything):
    admin = make_user("ada", ADMINS)
    server = register_everything(admin, everything, expect_tool="trigger-long-running-operation")
    workers.start("progress")
    # The reference server logs a line at once, then one every 5 s, on the session (the worker's stdio process).
    logging_on = services.launch(server=server, tool="toggle-simulated-logging", arguments={}, user=admin)
    wait_until(lambda: Task.objects.get(pk=logging_on.pk).is_terminal, timeout=60, what="logging turned on")
    task = services.launch(
        server=server, tool="trigger-long-running-operation", arguments={"duration": 6, "steps": 4}, user=admin
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

    lines = list(ServerLogLine.objects.filter(task=task))
    assert any(re.search(r"-level message|level-message", line.text) for line in lines), lines
    summary = wait_until(  # written once the launch job has closed the call, just after its outcome
        lambda: AuditEvent.objects.filter(task_id=task.pk, action="task.server_logged").first(),
        timeout=30,
        what="the call's summary of its server's log",
    )
    assert summary.data["lines"] == len(lines) and summary.data["dropped"] == 0
    page = Client()
    page.force_login(admin)
    assert f"server log: {lines[0].level}" in page.get(f"/tasks/{task.pk}/").text


async def test_a_chatty_servers_lines_are_rate_limited_capped_and_stored_escapable(admin_task):
    log = CallLog(admin_task.pk)
    for number in range(LOG_BURST + 30):
        log("info", "chatty", f"line {number}\x00<b>")
    log("warning", None, {"structured": ["data"]})
    await log.aclose()
    stored = await sync_to_async(list)(ServerLogLine.objects.filter(task=admin_task).order_by("at", "pk"))
    assert len(stored) == LOG_BURST and stored[0].text == "line 0\ufffd<b>" and stored[0].logger == "chatty"
    summary = await AuditEvent.objects.aget(task_id=admin_task.pk, action="task.server_logged")
    assert summary.data == {"lines": LOG_BURST, "dropped": 31, "levels": {"info": LOG_BURST}}


def test_a_task_keeps_its_last_lines_each_capped(admin_task):
    now = timezone.now()
    lines = [
        LogLine(at=now, level="loud", logger="x" * 300, data="y" * 5000) for _ in range(SERVER_LOG_LINES_KEPT + 20)
    ]
    assert record_server_log(task_id=admin_task.pk, lines=lines) == SERVER_LOG_LINES_KEPT
    record_server_log(task_id=admin_task.pk, lines=lines[:5])
    stored = ServerLogLine.objects.filter(task=admin_task)
    assert stored.count() == SERVER_LOG_LINES_KEPT
    kept = stored.first()
    assert (kept.level, len(kept.logger), len(kept.text)) == ("info", 100, SERVER_LOG_TEXT_MAX_CHARS)
    # Counted on the task, every line stored (the oldest dropped since): its timeline asks for them only then.
    admin_task.refresh_from_db()
    assert admin_task.server_log_lines == SERVER_LOG_LINES_KEPT + 5
    entries, _ = presenters.timeline(admin_task)
    assert sum(entry.action == "server.log" for entry in entries) == presenters.SERVER_LOG_SHOWN


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
