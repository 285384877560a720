"""Retention: finished tasks past their time removed."""

from django.db import transaction

from taskhub.audit.services import WORKER, record_event
from taskhub.tasks.models import (
    TERMINAL_STATUSES,
    Task,
)


@transaction.atomic
def purge_finished_tasks(*, finished_before, limit: int = 500) -> int:
    """Delete up to `limit` tasks that ended before `finished_before`, with their input requests and poll rows.

    Audit rows stay (append-only); each purge adds one saying so.
    """
    tasks = list(
        Task.objects.select_for_update(skip_locked=True)
        .filter(status__in=TERMINAL_STATUSES, finished_at__lt=finished_before)
        .order_by("finished_at")
        .only("id", "server_id", "tool", "status", "finished_at")[:limit]
    )
    for task in tasks:
        record_event(
            action="task.purged",
            actor_label=WORKER,
            task=task,
            data={"tool": task.tool, "status": task.status, "finished_at": task.finished_at.isoformat()},
        )
    Task.objects.filter(pk__in=[task.pk for task in tasks]).delete()
    return len(tasks)
