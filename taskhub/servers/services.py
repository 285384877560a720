"""Every change to a Server, each in one transaction with its audit row."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from taskhub.audit.services import WORKER, record_event
from taskhub.mcp.client import Discovery
from taskhub.servers.errors import ServerConfigInvalid
from taskhub.servers.models import Server

SECRET_FIELDS = frozenset({"env", "headers", "bearer_token"})
EDITABLE_FIELDS = (
    frozenset({"name", "transport", "url", "command", "args", "enabled", "max_concurrent_jobs", "call_timeout_seconds"})
    | SECRET_FIELDS
)
LAST_ERROR_MAX_CHARS = 2000


def _validated_save(server: Server) -> None:
    try:
        server.full_clean()
    except ValidationError as error:
        raise ServerConfigInvalid(error.message_dict) from error
    server.save()


@transaction.atomic
def create_server(
    *,
    name: str,
    transport: str,
    user,
    url: str = "",
    command: str = "",
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    bearer_token: str | None = None,
    enabled: bool = True,
    approver_groups: Iterable = (),
    max_concurrent_jobs: int | None = None,
    call_timeout_seconds: int | None = None,
) -> Server:
    server = Server(
        name=name,
        transport=transport,
        url=url,
        command=command,
        args=list(args),
        env=dict(env or {}),
        headers=dict(headers or {}),
        bearer_token=bearer_token or None,
        enabled=enabled,
        max_concurrent_jobs=max_concurrent_jobs,
        call_timeout_seconds=call_timeout_seconds,
    )
    _validated_save(server)
    server.approver_groups.set(approver_groups)
    record_event(
        action="server.created",
        user=user,
        server=server,
        data={"name": server.name, "transport": server.transport, "endpoint": server.to_target().describe()},
    )
    return server


@transaction.atomic
def update_server(*, server: Server, user, approver_groups: Iterable | None = None, **changes: Any) -> Server:
    """Change the given fields; the audit row names what changed, with values only for non-secret fields."""
    unknown = set(changes) - EDITABLE_FIELDS
    if unknown:
        raise TypeError(f"update_server cannot change {', '.join(sorted(unknown))}")
    server = Server.objects.select_for_update().get(pk=server.pk)
    changed: dict[str, Any] = {}
    for field, value in changes.items():
        if getattr(server, field) != value:
            setattr(server, field, value)
            changed[field] = "(secret changed)" if field in SECRET_FIELDS else value
    if approver_groups is not None:
        before = set(server.approver_groups.values_list("name", flat=True))
        groups = list(approver_groups)
        after = {group.name for group in groups}
        if before != after:
            server.approver_groups.set(groups)
            changed["approver_groups"] = sorted(after)
    if not changed:
        return server
    _validated_save(server)
    record_event(action="server.updated", user=user, server=server, data={"name": server.name, "changed": changed})
    return server


@transaction.atomic
def record_discovery(*, server: Server, discovery: Discovery, user=None) -> Server:
    server = Server.objects.select_for_update().get(pk=server.pk)
    now = timezone.now()
    server.capabilities = discovery.capabilities
    server.tools = discovery.tools
    server.discovered_at = now
    was_unreachable = _mark_reachable(server, now)
    server.save()
    record_event(
        action="server.discovered",
        user=user,
        actor_label=None if user else WORKER,
        server=server,
        data={
            "protocol_version": discovery.protocol_version,
            "server_info": discovery.server_info,
            "supports_tasks": discovery.supports_tasks,
            "tools": [tool.get("name") for tool in discovery.tools],
        },
    )
    if was_unreachable:
        record_event(action="server.reachable", actor_label=WORKER, server=server, data={"name": server.name})
    return server


@transaction.atomic
def record_server_success(*, server: Server) -> Server:
    """A request reached the server. Audited only when this ends an outage, not on every poll."""
    server = Server.objects.select_for_update().get(pk=server.pk)
    now = timezone.now()
    was_unreachable = _mark_reachable(server, now)
    server.save(update_fields=["last_success_at", "unreachable_since", "updated_at"])
    if was_unreachable:
        record_event(action="server.reachable", actor_label=WORKER, server=server, data={"name": server.name})
    return server


@transaction.atomic
def record_server_failure(*, server: Server, error: str) -> Server:
    """A request could not reach the server. Audited only when this starts an outage."""
    server = Server.objects.select_for_update().get(pk=server.pk)
    now = timezone.now()
    server.last_error = error[:LAST_ERROR_MAX_CHARS]
    server.last_error_at = now
    starts_outage = server.unreachable_since is None
    if starts_outage:
        server.unreachable_since = now
    server.save(update_fields=["last_error", "last_error_at", "unreachable_since", "updated_at"])
    if starts_outage:
        record_event(
            action="server.unreachable",
            actor_label=WORKER,
            server=server,
            data={"name": server.name, "error": server.last_error},
        )
    return server


def _mark_reachable(server: Server, now) -> bool:
    was_unreachable = server.unreachable_since is not None
    server.last_success_at = now
    server.unreachable_since = None
    return was_unreachable
