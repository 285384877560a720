"""What the domain announces to the layers above it. They subscribe in their AppConfig.ready() (taskhub.live
pushes a changed task to browsers), so the domain never imports them (DESIGN.md, "Dependency direction")."""

import uuid

from django.db import transaction
from django.dispatch import Signal

# Sent once the transaction that changed a task has committed, with task_id=<uuid.UUID>.
task_changed = Signal()


def announce_task_changed(task_id: uuid.UUID) -> None:
    """Tell task_changed's receivers after the current transaction commits (at once outside one), never if it
    rolls back. The change is committed by then, so a receiver that fails is logged (django.dispatch), not raised
    into the service that made it."""
    transaction.on_commit(lambda: task_changed.send_robust(sender=None, task_id=task_id))
