"""2025-11-25 tasks, followed on a session with their server by one worker at a time
(taskhub/worker/session_tasks.py; taskhub/mcp/session_tasks.py for the wire). Their snapshots go through
`apply_snapshot` like any other; what is theirs alone: a cancel goes out on the follower's session, and when the
follower goes (it stops, dies, or its session breaks) another worker takes the task up: the follow job asks the server
about it on a session of its own and follows it on if the server still knows it (a server whose tasks outlive the
session), or ends it as lost with the reason (the reference server keeps a task on the session that made it only).
A task is taken up at most `MAX_TAKE_UPS` times, so a server that breaks every session cannot keep it going round."""

from django.db import transaction

from taskhub.audit.services import WORKER, record_event
from taskhub.servers.hooks import job_queue
from taskhub.tasks import hooks
from taskhub.tasks.models import Task
from taskhub.tasks.services.common import _locked, _log_after_commit, _publish_after_commit
from taskhub.tasks.services.following import lose

FOLLOWER_GONE = "the worker following this task on its session with the server stopped"
SESSION_ENDED = "the session with the server that held this task ended before the task did"
NOT_KNOWN_ELSEWHERE = (
    "{why}; asked on a new session, the server no longer knows the task (it keeps a task on the session that made it"
    " only), so nobody can follow it any more"
)
TAKE_UPS_USED = "{why}; it was taken up {times} times already, which is as often as taskhub tries"
MAX_TAKE_UPS = 3
TAKE_UP_ACTION = "task.follower_gone"


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


@transaction.atomic
def hand_on_session_task(*, task_id, follower: str, why: str) -> bool:
    """The follower of a live 2025-11-25 task went (`why`): the follow job is deferred for another worker to take it
    up, with an audit row saying why; past `MAX_TAKE_UPS` the task ends as lost instead. False when the task ended
    already or another follower has it."""
    task = Task.objects.select_for_update(no_key=True, of=("self",)).select_related("server").get(pk=task_id)
    if task.is_terminal or task.followed_by != follower:
        return False
    times = task.audit_events.filter(action=TAKE_UP_ACTION).count()
    if times >= MAX_TAKE_UPS:
        _log_after_commit("lost (was %s): %s", task, task.status, why)
        lose(task, message=TAKE_UPS_USED.format(why=why, times=times), data={})
        return True
    task.followed_by = ""
    task.save(update_fields=["followed_by", "updated_at"])
    record_event(action=TAKE_UP_ACTION, actor_label=WORKER, task=task, data={"follower": follower, "why": why})
    hooks.enqueue_session_task_follow(task.pk, queue=job_queue(task.server))
    _publish_after_commit(task.id)
    return True


def lose_task_not_known_elsewhere(*, task_id) -> bool:
    """Taken up on a new session, the server does not know the task: lost, saying why its follower went."""
    last = (
        Task.objects.get(pk=task_id).audit_events.filter(action=TAKE_UP_ACTION).order_by("-id").values("data").first()
    )
    why = str((last or {}).get("data", {}).get("why") or FOLLOWER_GONE)
    return mark_session_task_lost(task_id=task_id, reason=NOT_KNOWN_ELSEWHERE.format(why=why)[:1000])


@transaction.atomic
def take_up_session_task(*, task_id, follower: str) -> Task | None:
    """The follow job's claim: the live, unfollowed task now followed by `follower`; None when there is nothing to
    follow (it ended, or another worker follows it)."""
    task = Task.objects.select_for_update(no_key=True, of=("self",)).select_related("server").get(pk=task_id)
    if task.is_terminal or task.followed_by or not task.remote_task_id:
        return None
    task.followed_by = follower
    task.save(update_fields=["followed_by", "updated_at"])
    _publish_after_commit(task.id)
    return task


def hand_on_tasks_followed_by(*, worker_ids: list[str]) -> int:
    """The 2025-11-25 tasks followed by workers found dead (heartbeats): each handed on to be taken up."""
    followed = Task.objects.filter(followed_by__in=worker_ids, finished_at__isnull=True).values_list(
        "pk", "followed_by"
    )
    return sum(
        hand_on_session_task(task_id=pk, follower=follower, why=FOLLOWER_GONE) for pk, follower in list(followed)
    )
