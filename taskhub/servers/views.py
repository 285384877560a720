"""Servers (admins): the list with health, add/edit with write-only credentials, a page per server, discovery.

Views are thin: the form parses, servers.services writes (each change with its audit row). Discovery never runs
in a request: adding a server and "Discover now" defer a job (taskhub.worker.jobs.discover_server), and the
page asks for its discovery part every second (servers:discovery, an htmx poll) until the job has recorded the
outcome.
"""

import logging

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from taskhub.accounts.permissions import admin_required
from taskhub.servers import services
from taskhub.servers.catalogue import endpoint_of, health_of, pretty_json, tools_of
from taskhub.servers.errors import ServerConfigInvalid
from taskhub.servers.forms import ServerForm
from taskhub.servers.models import Server

logger = logging.getLogger(__name__)


def _row(server: Server) -> dict:
    return {
        "server": server,
        "health": health_of(server),
        "endpoint": endpoint_of(server),
        "tools_count": len(tools_of(server)),
        "groups": [group.name for group in server.approver_groups.all()],
    }


@admin_required
def server_list(request):
    servers = [_row(server) for server in Server.objects.prefetch_related("approver_groups")]
    return render(request, "servers/list.html", {"rows": servers})


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
        "paused_tasks": 0 if server.enabled else server.tasks.filter(poll__isnull=False).count(),
    }


@admin_required
def server_detail(request, server_id):
    server = get_object_or_404(Server.objects.prefetch_related("approver_groups"), pk=server_id)
    return render(request, "servers/detail.html", _detail_context(server))


@admin_required
def server_discovery(request, server_id):
    """The page's discovery part (status, health, tools, capabilities), asked for every second while it runs."""
    server = get_object_or_404(Server.objects.prefetch_related("approver_groups"), pk=server_id)
    return render(request, "servers/detail.html#discovery", {**_detail_context(server), "polled": True})


@admin_required
@require_POST
def server_discover(request, server_id):
    """Ask the server again, in the background: the page shows the discovery running, then its outcome."""
    server = get_object_or_404(Server, pk=server_id)
    services.request_discovery(server=server, user=request.user)
    return redirect("servers:detail", server_id=server.pk)
