"""Every change to a Server, each in one transaction with its audit row."""

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext

from taskhub.audit.services import WORKER, record_event
from taskhub.mcp.address_policy import AddressRefused
from taskhub.mcp.client import Discovery
from taskhub.mcp.secret_urls import mask_urls_in, masked_parameters, split_secrets
from taskhub.servers import hooks
from taskhub.servers.errors import ServerConfigInvalid, ServerRemoved
from taskhub.servers.models import NAME_TAKEN, Server, ServerAuthorization, Transport
from taskhub.servers.policy import server_address_policy

SECRET_FIELDS = frozenset({"env", "headers", "bearer_token", "url_secrets"})
EDITABLE_FIELDS = frozenset(
    {
        "name",
        "transport",
        "url",
        "command",
        "args",
        "enabled",
        "env",
        "headers",
        "bearer_token",
        "max_concurrent_jobs",
        "call_timeout_seconds",
        "question_wait_seconds",
        "roots",
        "sampling_declined",
    }
)
LAST_ERROR_MAX_CHARS = 2000


def _secrets_out_of_the_url(server: Server, *, stored: Mapping[str, list[str]]) -> None:
    """Keep the URL's credentials out of the `url` column (shown on pages, in the form, in audit rows).

    A userinfo (`user:password@`) becomes an `Authorization: Basic` header, which is what the HTTP clients made of
    it anyway, stored encrypted with the other headers: the URL then carries no credential to any library that
    logs or quotes it, and the admin types nothing again. Secret query values must still be sent in the query, so
    they are stored encrypted in `url_secrets` and the URL keeps *** in their place; a *** typed back (the form
    shows the URL masked) keeps the stored value. Secrets are never named in an error, only their parameter."""
    if server.transport != Transport.HTTP or not server.url:
        return
    try:
        public, userinfo, typed = split_secrets(server.url)
    except ValueError:
        return  # full_clean says the URL is not valid
    secrets: dict[str, list[str]] = {}
    for name in dict.fromkeys(name for name in masked_parameters(public)):
        values = typed.get(name) or list(stored.get(name) or [])
        if not values:
            raise ServerConfigInvalid({"url": [f"The value of the URL's {name} parameter is hidden (***): type it."]})
        secrets[name] = values
    if userinfo is not None:
        if server.bearer_token:
            raise ServerConfigInvalid(
                {"url": ["The URL has a user and password and the server has a bearer token: keep only one."]}
            )
        basic = base64.b64encode(f"{userinfo[0]}:{userinfo[1]}".encode()).decode()
        headers = {k: v for k, v in (server.headers or {}).items() if k.lower() != "authorization"}
        server.headers = {**headers, "Authorization": f"Basic {basic}"}
    server.url = public
    server.url_secrets = secrets


def _check_address(server: Server) -> None:
    """Refuse a URL the address policy refuses (its host as written and every address it resolves to now)."""
    if server.transport != Transport.HTTP or not server.url:
        return
    try:
        server_address_policy().check_url(server.url, resolve=True)
    except AddressRefused as refused:
        raise ServerConfigInvalid({"url": [f"Not an address for MCP servers: {refused}."]}) from refused
    except ValueError:
        return  # full_clean says the URL is not valid


def _validated_save(server: Server) -> None:
    try:
        server.full_clean()
    except ValidationError as error:
        problems = error.message_dict
        # The name's uniqueness is a conditional constraint (among servers in use), so Django reports it for the
        # whole form: it belongs next to the name.
        taken = [e for e in error.error_dict.get(NON_FIELD_ERRORS, []) if e.code == NAME_TAKEN]
        if taken:
            problems[NON_FIELD_ERRORS] = [m for m in problems[NON_FIELD_ERRORS] if m not in taken[0].messages]
            problems.setdefault("name", []).extend(taken[0].messages)
            problems = {field: messages for field, messages in problems.items() if messages}
        raise ServerConfigInvalid(problems) from error
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
    discover_in_background: bool = False,
    max_concurrent_jobs: int | None = None,
    call_timeout_seconds: int | None = None,
    question_wait_seconds: int | None = None,
    roots: Sequence[Mapping[str, str]] = (),
    sampling_declined: bool = False,
) -> Server:
    """Register a server. With `discover_in_background` (the add-server page), its discovery job is deferred in
    the same transaction; the terminal commands (`manage.py server add --discover`, `taskhub demo`) discover
    it themselves afterwards, through servers.discovery.discover_and_record, while their person waits."""
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
        question_wait_seconds=question_wait_seconds,
        roots=[dict(root) for root in roots],
        sampling_declined=sampling_declined,
    )
    _secrets_out_of_the_url(server, stored={})
    _check_address(server)
    _validated_save(server)
    record_event(
        action="server.created",
        user=user,
        server=server,
        data={"name": server.name, "transport": server.transport, "endpoint": server.to_target().describe()},
    )
    if discover_in_background:
        _queue_discovery(server, user)
    return server


@transaction.atomic
def request_discovery(*, server: Server, user) -> Server:
    """“Discover now”: the job asks the server in the background; the page shows it pending meanwhile."""
    server = Server.objects.select_for_update(no_key=True).get(pk=server.pk)
    _refuse_removed(server)
    _queue_discovery(server, user)
    return server


def _refuse_removed(server: Server) -> None:
    if server.removed_at is not None:
        raise ServerRemoved(
            gettext("The server %(server)s was removed; it cannot be changed or used any more.")
            % {"server": server.name}
        )


@transaction.atomic
def remove_server(*, server: Server, user) -> Server:
    """Remove a server from use, for good: disabled (the tracker claims none of its tasks, launches are refused),
    marked removed (answer and cancel deliveries are not sent, it leaves the lists), its discovery forgotten. The
    row stays, so its tasks, their requests and the audit trail stay readable with its name. Removing twice
    changes nothing."""
    server = Server.objects.select_for_update(no_key=True).get(pk=server.pk)
    if server.removed_at is not None:
        return server
    server.enabled = False
    server.removed_at = timezone.now()
    server.removed_by = user
    server.discovery_pending_since = None
    server.save(update_fields=["enabled", "removed_at", "removed_by", "discovery_pending_since", "updated_at"])
    record_event(action="server.removed", user=user, server=server, data={"name": server.name})
    return server


def _queue_discovery(server: Server, user) -> None:
    server.discovery_pending_since = timezone.now()
    server.save(update_fields=["discovery_pending_since", "updated_at"])
    hooks.enqueue_discovery(server.pk, requested_by=getattr(user, "pk", None), queue=hooks.job_queue(server))


@transaction.atomic
def update_server(*, server: Server, user, **changes: Any) -> Server:
    """Change the given fields; the audit row names what changed, with values only for non-secret fields."""
    unknown = set(changes) - EDITABLE_FIELDS
    if unknown:
        raise TypeError(f"update_server cannot change {', '.join(sorted(unknown))}")
    server = Server.objects.select_for_update(no_key=True).get(pk=server.pk)
    _refuse_removed(server)
    before = {field: getattr(server, field) for field in EDITABLE_FIELDS | SECRET_FIELDS}
    for field, value in changes.items():
        setattr(server, field, value)
    _secrets_out_of_the_url(server, stored=before["url_secrets"] or {})
    changed: dict[str, Any] = {}
    for field, value in before.items():
        if getattr(server, field) != value:
            changed[field] = "(secret changed)" if field in SECRET_FIELDS else getattr(server, field)
    if not changed:
        return server
    if "url" in changed or "transport" in changed:
        _check_address(server)
    _validated_save(server)
    record_event(action="server.updated", user=user, server=server, data={"name": server.name, "changed": changed})
    return server


@transaction.atomic
def record_discovery(*, server: Server, discovery: Discovery, user=None) -> Server:
    server = Server.objects.select_for_update(no_key=True).get(pk=server.pk)
    now = timezone.now()
    server.capabilities = discovery.capabilities
    server.tools = discovery.tools
    server.discovered_at = now
    server.discovery_pending_since = None
    server.discovery_error = ""
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
    server = Server.objects.select_for_update(no_key=True).get(pk=server.pk)
    now = timezone.now()
    was_unreachable = _mark_reachable(server, now)
    server.save(update_fields=["last_success_at", "unreachable_since", "updated_at"])
    if was_unreachable:
        record_event(action="server.reachable", actor_label=WORKER, server=server, data={"name": server.name})
    return server


@transaction.atomic
def record_server_failure(*, server: Server, error: str) -> Server:
    """A request could not reach the server. Audited only when this starts an outage."""
    server = Server.objects.select_for_update(no_key=True).get(pk=server.pk)
    now = timezone.now()
    server.last_error = mask_urls_in(error)[:LAST_ERROR_MAX_CHARS]
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


@transaction.atomic
def record_discovery_failure(*, server: Server, error: str) -> Server:
    """A discovery could not reach the server or was answered badly: its health says so, and the page says why."""
    server = record_server_failure(server=server, error=error)
    server.discovery_pending_since = None
    server.discovery_error = error[:LAST_ERROR_MAX_CHARS]
    server.save(update_fields=["discovery_pending_since", "discovery_error", "updated_at"])
    return server


def _mark_reachable(server: Server, now) -> bool:
    was_unreachable = server.unreachable_since is not None
    server.last_success_at = now
    server.unreachable_since = None
    return was_unreachable


def needs_reauthorization(*, server_id: int) -> bool:
    """Whether the server, connected through OAuth, waits for an admin to connect it again (issue 33): launches and
    answers for it wait meanwhile."""
    return ServerAuthorization.objects.filter(
        server_id=server_id, server__oauth=True, needs_reauthorization_since__isnull=False
    ).exists()
