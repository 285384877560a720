"""What a server reports about a call in flight, any revision: its progress (`notifications/progress`) and its log
lines (`notifications/message`). Display, not decisions: no audit row per report."""

import datetime
import json
import math
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Mod
from django.utils import timezone

from taskhub.audit.services import WORKER, record_event
from taskhub.tasks import storable_text
from taskhub.tasks.models import LIVE_STATUSES, ProgressMessage, ServerLogLine, Task, TaskStatus
from taskhub.tasks.services.common import _publish_after_commit

PROGRESS_MESSAGE_MAX_CHARS = 500
# A progress or total past this is a server's nonsense, not a count: not shown.
PROGRESS_MAX = 1e15


@transaction.atomic
def record_progress(*, task_id, progress: float, total: float | None, message: str | None) -> bool:
    """The latest progress of a task's call, while the task is not over; False when nothing was written (the task
    ended, or the numbers are not finite counts). No audit row: progress is no decision (the timeline shows the
    status changes; the bar shows this)."""
    if not _count(progress) or (total is not None and (not _count(total) or total <= 0)):
        return False
    text = (message or "").replace("\x00", "\ufffd")
    if storable_text.value_problem(text):
        text = ""
    if len(text) > PROGRESS_MESSAGE_MAX_CHARS:
        text = text[: PROGRESS_MESSAGE_MAX_CHARS - 1] + "…"
    live = Task.objects.filter(pk=task_id, status__in=(TaskStatus.LAUNCHING, *LIVE_STATUSES))
    said_before, counted = live.values_list("progress_message", "progress_updates").first() or ("", 0)
    updated = live.update(
        progress=progress, progress_total=total, progress_message=text, progress_updates=F("progress_updates") + 1
    )
    if updated:
        if text and text != said_before:  # numbered with gaps (repeats are counted, not kept): trimmed every time
            keep_progress_message(task_id=task_id, number=counted + 1, text=text, trim_every=1)
        _publish_after_commit(task_id)
    return bool(updated)


# --- the progress history -------------------------------------------------------------------------------------------

# The newest this many a task's history keeps whole; of the older ones at most PROGRESS_OLDER_KEPT, evenly spread.
PROGRESS_MESSAGES_KEPT = 200
PROGRESS_OLDER_KEPT = 50
PROGRESS_TRIM_EVERY = 20  # trimmed on every 20th message: one DELETE per 20 inserts


def keep_progress_message(*, task_id, number: int, text: str, trim_every: int = PROGRESS_TRIM_EVERY) -> None:
    """Keep the `number`th progress report of a task (counted by the caller, in its transaction), a status message
    the server reported with the task's status unchanged, in the task's progress history; older ones thinned."""
    ProgressMessage.objects.create(task_id=task_id, number=number, at=timezone.now(), text=text)
    if number % trim_every:
        return
    # Older than the newest PROGRESS_MESSAGES_KEPT: the first stays, and numbers divisible by a power-of-two stride,
    # the smallest that leaves at most PROGRESS_OLDER_KEPT of them. A larger stride keeps a subset of a smaller
    # one's, so what was thinned once is never wanted back.
    older_than = number - PROGRESS_MESSAGES_KEPT
    stride = 1
    while older_than // stride > PROGRESS_OLDER_KEPT:
        stride *= 2
    if older_than > 0:
        older = ProgressMessage.objects.filter(task_id=task_id, number__gt=1, number__lte=older_than)
        older.alias(off_stride=Mod("number", stride)).exclude(off_stride=0).delete()


def _count(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= PROGRESS_MAX


# --- server log lines -----------------------------------------------------------------------------------------------

SERVER_LOG_LINES_KEPT = 200
SERVER_LOG_TEXT_MAX_CHARS = 1000
SERVER_LOG_LEVELS = frozenset({"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"})


@dataclass(frozen=True)
class LogLine:
    at: datetime.datetime
    level: str
    logger: str
    data: Any  # as sent: a string, or any JSON value


def record_server_log(*, task_id, lines: list[LogLine]) -> int:
    """Store what a server logged during a call of the task (escaped when shown, capped, the last
    SERVER_LOG_LINES_KEPT kept); returns how many were stored. No audit row per line: see summarise_server_log."""
    rows = [
        ServerLogLine(
            task_id=task_id,
            at=line.at,
            level=line.level if line.level in SERVER_LOG_LEVELS else "info",
            logger=_log_text(line.logger, 100),
            text=_log_text(line.data if isinstance(line.data, str) else json.dumps(line.data, default=str), None),
        )
        for line in lines[-SERVER_LOG_LINES_KEPT:]
    ]
    if not rows:
        return 0
    with transaction.atomic():
        if not Task.objects.filter(pk=task_id).update(server_log_lines=F("server_log_lines") + len(rows)):
            return 0  # the task is gone
        ServerLogLine.objects.bulk_create(rows)
        kept = ServerLogLine.objects.filter(task_id=task_id).order_by("-at", "-pk")[
            SERVER_LOG_LINES_KEPT : SERVER_LOG_LINES_KEPT + 1
        ]
        oldest_kept = kept.values_list("pk", flat=True).first()
        if oldest_kept is not None:
            ServerLogLine.objects.filter(task_id=task_id, pk__lte=oldest_kept).delete()
        _publish_after_commit(task_id)
    return len(rows)


@transaction.atomic
def summarise_server_log(*, task_id, lines: int, dropped: int, levels: dict[str, int]) -> None:
    """One audit row for what a server logged during one call (the lines themselves are on the task page)."""
    task = Task.objects.filter(pk=task_id).only("id", "server_id").first()
    if task is None or not (lines or dropped):
        return
    data = {"lines": lines, "dropped": dropped, "levels": dict(sorted(levels.items()))}
    record_event(action="task.server_logged", actor_label=WORKER, task=task, data=data)


def _log_text(value: Any, limit: int | None) -> str:
    text = (value if isinstance(value, str) else str(value or "")).replace("\x00", "\ufffd")
    if storable_text.value_problem(text):
        text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    limit = limit or SERVER_LOG_TEXT_MAX_CHARS
    return text if len(text) <= limit else text[: limit - 1] + "…"
