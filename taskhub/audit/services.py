"""Writing audit rows. Callers are services, inside the transaction of the change they record."""

from typing import Any

from django.db import transaction

from taskhub.audit.events import check_action
from taskhub.audit.models import AuditEvent

SYSTEM = "system"
WORKER = "worker"


def storable(value: Any) -> Any:
    """`value` with what Postgres cannot store in text or jsonb replaced by U+FFFD: NUL characters and
    lone surrogates (both valid in JSON, so any server can send them)."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        try:
            value.encode()
        except UnicodeEncodeError:
            value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [storable(item) for item in value]
    return value


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
        data=storable(data or {}),
    )
