"""Cancelling a task: before it is sent, at its gate, or by asking the server."""

from django.db import transaction
from django.utils import timezone

from taskhub.audit.services import WORKER, record_event
from taskhub.servers.hooks import job_queue
from taskhub.tasks import hooks
from taskhub.tasks.errors import (
    InvalidTransition,
    TaskAlreadyFinished,
)
from taskhub.tasks.models import (
    CANCELLED_NOT_SENT,
    GATE_METHOD,
    Task,
    TaskStatus,
)
from taskhub.tasks.services.common import _finished, _locked, _publish_after_commit
from taskhub.tasks.services.following import _supersede_open_requests
from taskhub.tasks.services.sending import launch_was_sent


@transaction.atomic
def request_cancel(*, task: Task, user, bulk_action: int | None = None, lane: str | None = None, token=None) -> Task:
    """Record the wish to cancel; the cancel job sends tasks/cancel. Asking twice is asking once.

    `bulk_action`: the audit row of the bulk cancel this one is part of (bulk.py), named in this task's row;
    `lane`: the bulk's job lane for the task's server (hooks.enqueue_cancel_delivery); `token`: the API token (an
    agent) the cancel came through, named in its audit rows."""
    task = _locked(task)
    if task.is_terminal:
        raise TaskAlreadyFinished(f"The task is already {task.get_status_display()}; there is nothing to cancel.")
    if task.status == TaskStatus.LAUNCH_UNKNOWN:
        raise InvalidTransition(
            "The launch outcome is unknown, so there is no remote task to cancel; check the server directly."
        )
    if task.cancel_requested_at is not None:
        return task
    if task.status == TaskStatus.LAUNCHING and task.input_requests.filter(method=GATE_METHOD, state="open").exists():
        return _cancel_at_the_gate(task, user=user, bulk_action=bulk_action, token=token)
    task.cancel_requested_at = timezone.now()
    task.cancel_requested_by = user
    task.save(update_fields=["cancel_requested_at", "cancel_requested_by", "updated_at"])
    data = {"status": task.status, **({"bulk_action": bulk_action} if bulk_action is not None else {})}
    record_event(action="task.cancel_requested", user=user, task=task, data=data, token=token)
    if task.status == TaskStatus.LAUNCHING and not launch_was_sent(task=task):
        _cancel_before_sending(task)
    else:
        hooks.enqueue_cancel_delivery(task.id, queue=job_queue(task.server), lane=lane)
    _publish_after_commit(task.id)
    return task


def _cancel_before_sending(task: Task) -> None:
    """A launch whose tool call (of its current round) is not sent yet ends here, cancelled, and is never sent.

    The task is locked, and the launch job writes its `task.launch_sent` marker under that lock before it sends
    (mark_launch_sent): so either the marker is there and the call may be under way (then the cancel waits for its
    outcome, which may be unknown), or the job will find the task cancelled and send nothing. Its waiting retry is
    dropped."""
    task.status = TaskStatus.CANCELLED
    task.finished_at = timezone.now()
    task.mrtr_request_state = None
    task.launch_next_try_at = None
    task.save(update_fields=["status", "finished_at", "mrtr_request_state", "launch_next_try_at", "updated_at"])
    record_event(
        action="task.status_changed",
        actor_label=WORKER,
        task=task,
        data={
            "from": TaskStatus.LAUNCHING,
            "to": TaskStatus.CANCELLED,
            "source": CANCELLED_NOT_SENT,
            "sent": False,
            "attempts": task.launch_attempts,
        },
    )
    _supersede_open_requests(task, reason="the tool call was cancelled")
    hooks.drop_pending_launch(task.id)
    _finished(task)


def _cancel_at_the_gate(task: Task, *, user, bulk_action: int | None = None, token=None) -> Task:
    """A launch still waiting for its approval was never sent: it ends here, cancelled, with nothing to tell."""
    now = timezone.now()
    task.cancel_requested_at = task.cancel_delivered_at = task.finished_at = now
    task.cancel_requested_by = user
    task.status = TaskStatus.CANCELLED
    task.status_message, task.status_message_is_taskhubs = "cancelled before the call was approved", True
    task.save()
    data = {"status": TaskStatus.LAUNCHING, **({"bulk_action": bulk_action} if bulk_action is not None else {})}
    record_event(action="task.cancel_requested", user=user, task=task, data=data, token=token)
    record_event(
        action="task.status_changed",
        user=user,
        task=task,
        data={"from": TaskStatus.LAUNCHING, "to": TaskStatus.CANCELLED, "source": "cancel before the approval"},
        token=token,
    )
    _supersede_open_requests(task, reason="the launch was cancelled before its approval")
    _finished(task)
    _publish_after_commit(task.id)
    return task
