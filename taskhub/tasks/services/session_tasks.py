"""2025-11-25 tasks, followed on the session that created them by the worker that launched them
(taskhub/worker/session_tasks.py; taskhub/mcp/session_tasks.py for the wire). Their snapshots go through
`apply_snapshot` like any other; what is theirs alone: a cancel goes out on that session, and the death of the
worker that follows one ends it as lost, since no other worker can join that session."""

from django.db import transaction

from taskhub.tasks.models import Task
from taskhub.tasks.services.common import _locked, _log_after_commit
from taskhub.tasks.services.following import lose

FOLLOWER_GONE = (
    "the worker following this task on its session with the server stopped; the server keeps such a task on that"
    " session only, so nobody can follow it any more"
)
SESSION_ENDED = "the session with the server that held this task ended before the task did"


def cancel_wanted(*, task_id) -> bool:
    """Whether a person asked to cancel the task and the cancel has not gone out yet (read-only)."""
    return Task.objects.filter(
        pk=task_id, cancel_requested_at__isnull=False, cancel_delivered_at__isnull=True, finished_at__isnull=True
    ).exists()


@transaction.atomic
def mark_session_task_lost(*, task_id, reason: str) -> bool:
    """End a live 2025-11-25 task whose session is gone. False when it had ended already."""
    task = _locked(Task.objects.get(pk=task_id))
    if task.is_terminal:
        return False
    _log_after_commit("lost (was %s): %s", task, task.status, reason)
    lose(task, message=reason, data={})
    return True


def lose_tasks_followed_by(*, worker_ids: list[str]) -> int:
    """The 2025-11-25 tasks followed by workers found dead (heartbeats): each ended as lost."""
    followed = Task.objects.filter(followed_by__in=worker_ids, finished_at__isnull=True).values_list("pk", flat=True)
    return sum(mark_session_task_lost(task_id=pk, reason=FOLLOWER_GONE) for pk in list(followed))
