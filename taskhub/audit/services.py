"""Writing audit rows. Callers are services, inside the transaction of the change they record."""

from typing import Any

from django.db import transaction

from taskhub.audit.events import check_action
from taskhub.audit.models import AuditEvent

SYSTEM = "system"
WORKER = "worker"
# A tools/call the gateway sent itself (taskhub/gateway/sending.py): its marker and outcome are recorded as its.
GATEWAY = "gateway"
# An answer the web process sent itself (taskhub/gateway/sending.py): its claim and delivery are recorded as its.
WEB = "web"


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


def agent_facts(token) -> dict[str, Any]:
    """What the audit keeps of the API token (an agent) an action came through: `data["agent"]` of its row. Any object
    with pk, name and prefix (an api.ApiToken; this layer never imports the API)."""
    return {"token_id": token.pk, "name": token.name, "prefix": token.prefix}


def record_event(**fields) -> AuditEvent:
    """One audit row (`fields`: audit_event's), written in the transaction of the change it records."""
    (recorded,) = record_events(audit_event(**fields))
    return recorded


def record_events(*events: AuditEvent) -> list[AuditEvent]:
    """The rows of one change (audit_event), written in its transaction in one statement, in this order: a round
    trip to Postgres less per row more than one (a launch the gateway sends itself: its launch and its round marked
    sent)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record_event must run inside the transaction of the change it records")
    return AuditEvent.objects.bulk_create(events)


def audit_event(
    *,
    action: str,
    user=None,
    actor_label: str | None = None,
    task=None,
    server=None,
    data: dict[str, Any] | None = None,
    token=None,
) -> AuditEvent:
    """An audit row to record (record_events). `token`: the API token (an agent) the action came through, kept as
    `data["agent"]`; the actor stays its user, so filtering by actor finds what a person did by hand and through
    their agents alike."""
    check_action(action)
    if token is not None:
        data = {**(data or {}), "agent": agent_facts(token)}
    return AuditEvent(
        action=action,
        actor=user,
        actor_label=actor_label or actor_label_for(user, SYSTEM),
        task=task,
        server_id=server.pk if server is not None else getattr(task, "server_id", None),
        data=storable(data or {}),
    )
