"""Servers (admins): the list with health, add/edit with write-only credentials, a page per server, discovery.

Views are thin: the form parses, servers.services writes (each change with its audit row). Discovery never runs
in a request: adding a server and "Discover now" defer a job (taskhub.worker.jobs.discover_server), and the
page asks for its discovery part every second (servers:discovery, an htmx poll) until the job has recorded the
outcome.
"""

import logging

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext
from django.views.decorators.http import require_POST

from taskhub.accounts.permissions import admin_required
from taskhub.servers import services
from taskhub.servers.catalogue import endpoint_of, health_of, pretty_json, tools_of
from taskhub.servers.errors import ServerConfigInvalid, ServerRemoved
from taskhub.servers.forms import ServerForm
from taskhub.servers.models import Server, ServerAuthorization, ServerProcess

logger = logging.getLogger(__name__)


# Who answers a server's requests: its approval policies (taskhub/approvals), read through the relation.
POLICIES = ("approval_policies__groups", "approval_policies__users")


def _policies(server: Server) -> list[tuple[str, str]]:
    """(which tools, who answers) for each approval policy of the server, the server-wide one first."""
    rows = []
    for policy in sorted(server.approval_policies.all(), key=lambda policy: policy.tool):
        names = sorted(group.name for group in policy.groups.all()) + sorted(
            user.get_username() for user in policy.users.all()
        )
        rows.append((policy.tool or gettext("every tool"), ", ".join(names) or gettext("all approvers")))
    return rows


def _row(server: Server) -> dict:
    return {
        "server": server,
        "health": health_of(server),
        "endpoint": endpoint_of(server),
        "tools_count": len(tools_of(server)),
        "policies": _policies(server),
    }


@admin_required
def server_list(request):
    servers = Server.objects.select_related("process").prefetch_related(*POLICIES)
    rows = [_row(server) for server in servers.filter(removed_at__isnull=True)]
    removed = Server.objects.filter(removed_at__isnull=False).select_related("removed_by").order_by("-removed_at")
    return render(request, "servers/list.html", {"rows": rows, "removed": removed})


def _save(request, form: ServerForm, server: Server | None):
    """Create or update through the services; ServerConfigInvalid lands next to its fields."""
    arguments = form.service_arguments()
    try:
        if server is None:
            return services.create_server(user=request.user, discover_in_background=True, **arguments)
        return services.update_server(server=server, user=request.user, **arguments)
    except ServerConfigInvalid as error:
        for field, problems in error.messages.items():
            target = field if field in form.fields and field not in ("bearer_token", "headers", "env") else None
            for problem in problems:
                form.add_error(target, problem)
        return None


@admin_required
def server_add(request):
    form = ServerForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        server = _save(request, form, None)
        if server is not None:
            messages.success(request, f"Server {server.name} added.")
            return redirect("servers:detail", server_id=server.pk)
    status = 400 if form.is_bound else 200
    return render(request, "servers/form.html", {"form": form, "server": None}, status=status)


@admin_required
def server_edit(request, server_id):
    server = get_object_or_404(Server, pk=server_id)
    if server.removed_at is not None:
        messages.error(request, f"The server {server.name} was removed; it cannot be edited.")
        return redirect("servers:detail", server_id=server.pk)
    form = ServerForm(request.POST or None, server=server)
    if request.method == "POST" and form.is_valid():
        saved = _save(request, form, server)
        if saved is not None:
            messages.success(request, f"Server {saved.name} saved.")
            return redirect("servers:detail", server_id=saved.pk)
    status = 400 if form.is_bound else 200
    return render(request, "servers/form.html", {"form": form, "server": server}, status=status)


def _detail_context(server: Server) -> dict:
    return {
        **_row(server),
        "tools": tools_of(server),
        "capabilities_json": pretty_json(server.capabilities),
        "header_names": sorted(server.headers or {}),
        "env_names": sorted(server.env or {}),
        "has_token": bool(server.bearer_token),
        "needs_reauthorization_since": (
            ServerAuthorization.objects.filter(server=server)
            .values_list("needs_reauthorization_since", flat=True)
            .first()
            if server.oauth
            else None
        ),
        "paused_tasks": 0 if server.enabled else server.tasks.filter(poll__isnull=False).count(),
        "process": ServerProcess.objects.filter(server=server).first() if server.transport == "stdio" else None,
    }


@admin_required
def server_detail(request, server_id):
    server = get_object_or_404(Server.objects.prefetch_related(*POLICIES), pk=server_id)
    return render(request, "servers/detail.html", _detail_context(server))


@admin_required
def server_process(request, server_id):
    """The process part of a stdio server's page, asked for again every few seconds while the page is open."""
    server = get_object_or_404(Server, pk=server_id, transport="stdio")
    process = ServerProcess.objects.filter(server=server).first()
    return render(request, "servers/detail.html#process", {"server": server, "process": process})


@admin_required
def server_discovery(request, server_id):
    """The page's discovery part (status, health, tools, capabilities), asked for every second while it runs."""
    server = get_object_or_404(Server.objects.prefetch_related(*POLICIES), pk=server_id)
    return render(request, "servers/detail.html#discovery", {**_detail_context(server), "polled": True})


@admin_required
@require_POST
def server_discover(request, server_id):
    """Ask the server again, in the background: the page shows the discovery running, then its outcome."""
    server = get_object_or_404(Server, pk=server_id)
    try:
        services.request_discovery(server=server, user=request.user)
    except ServerRemoved as error:
        messages.error(request, str(error))
    return redirect("servers:detail", server_id=server.pk)


@admin_required
def server_remove(request, server_id):
    """A confirmation page saying what removing does to the server's tasks; its form's POST removes it."""
    server = get_object_or_404(Server.objects.select_related("removed_by"), pk=server_id)
    if server.removed_at is not None:
        messages.info(request, f"The server {server.name} was removed already.")
        return redirect("servers:detail", server_id=server.pk)
    if request.method == "POST":
        if request.POST.get("confirm") != server.name:
            messages.error(request, f"Nothing was removed: type the server's name, {server.name}, to confirm.")
            return render(request, "servers/remove.html", _removal_context(server), status=400)
        services.remove_server(server=server, user=request.user)
        messages.success(request, f"Server {server.name} removed. Its tasks and their history stay readable.")
        return redirect("servers:list")
    return render(request, "servers/remove.html", _removal_context(server))


def _removal_context(server: Server) -> dict:
    return {
        "server": server,
        "tasks_count": server.tasks.count(),
        "followed_count": server.tasks.filter(poll__isnull=False).count(),
    }
