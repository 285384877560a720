"""Writing audit rows. Callers are services, inside the transaction of the change they record."""

from typing import Any

from django.db import transaction

from taskhub.audit.events import check_action
from taskhub.audit.models import AuditEvent

SYSTEM = "system"
WORKER = "worker"


def actor_label_for(user, default: str) -> str:
    return user.get_username() if user is not None else default


def record_event(
    *,
    action: str,
    user=None,
    actor_label: str | None = None,
    task=None,
    server=None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    check_action(action)
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record_event must run inside the transaction of the change it records")
    return AuditEvent.objects.create(
        action=action,
        actor=user,
        actor_label=actor_label or actor_label_for(user, SYSTEM),
        task=task,
        server_id=server.pk if server is not None else getattr(task, "server_id", None),
        data=data or {},
    )
