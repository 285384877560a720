"""The progress a server reports on a call in flight (`notifications/progress`, any revision)."""

import math

from django.db import transaction

from taskhub.tasks import storable_text
from taskhub.tasks.models import LIVE_STATUSES, Task, TaskStatus
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
    live = (TaskStatus.LAUNCHING, *LIVE_STATUSES)
    updated = Task.objects.filter(pk=task_id, status__in=live).update(
        progress=progress, progress_total=total, progress_message=text
    )
    if updated:
        _publish_after_commit(task_id)
    return bool(updated)


def _count(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= PROGRESS_MAX
