"""What the domain announces to the layers above it. They subscribe in their AppConfig.ready() (taskhub.live
pushes a changed task to browsers), so the domain never imports them (DESIGN.md, "Dependency direction")."""

import uuid

from django.db import transaction
from django.dispatch import Signal

# Sent once the transaction that changed a task has committed, with task_id=<uuid.UUID> and asking_on_server=<int>
# (the task's server, where the sender knows the task has input requests) or None.
task_changed = Signal()


def announce_task_changed(task_id: uuid.UUID, *, server_id: int | None = None, asks: bool = False) -> None:
    """Tell task_changed's receivers after the current transaction commits (at once outside one), never if it
    rolls back. The change is committed by then, so a receiver that fails is logged (django.dispatch), not raised
    into the service that made it. `server_id` (the task's server) and `asks` (whether the task has input
    requests) where the caller knows them; None: the receivers look them up."""
    transaction.on_commit(
        lambda: task_changed.send_robust(sender=None, task_id=task_id, server_id=server_id, asks=asks)
    )


# Sent once the transaction that opened input requests has committed, with task_id=<uuid.UUID> and
# input_request_ids=[<int>, ...] (a gate before the call is one of them). Notifications (mail, webhooks) listen.
input_requests_opened = Signal()


def announce_input_requests_opened(task_id: uuid.UUID, input_request_ids: list[int]) -> None:
    """Tell input_requests_opened's receivers after the current transaction commits, never if it rolls back."""
    if not input_request_ids:
        return
    ids = list(input_request_ids)
    transaction.on_commit(
        lambda: input_requests_opened.send_robust(sender=None, task_id=task_id, input_request_ids=ids)
    )


# Sent once the transaction that ended a task (completed, failed, cancelled, expired, lost) has committed, with
# task_id=<uuid.UUID>, status=<str> and launched_by_id=<int> (None: launched by nobody still known). Notifications
# ("a task I launched finished") listen.
task_finished = Signal()


def announce_task_finished(task_id: uuid.UUID, status: str, *, launched_by_id: int | None) -> None:
    """Tell task_finished's receivers after the current transaction commits, never if it rolls back."""
    transaction.on_commit(
        lambda: task_finished.send_robust(
            sender=None, task_id=task_id, status=str(status), launched_by_id=launched_by_id
        )
    )
