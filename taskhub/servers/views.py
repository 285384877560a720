"""Servers (admins): the list with health, add/edit with write-only credentials, a page per server, discovery.

Views are thin: the form parses, servers.services writes (each change with its audit row). Discovery never runs
in a request: adding a server and "Discover now" defer a job (taskhub.worker.jobs.discover_server), and the
page asks for its discovery part every second (servers:discovery, an htmx poll) until the job has recorded the
outcome.
"""

import logging
import time
from urllib.parse import urlsplit

from django.contrib import messages
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext
from django.views.decorators.http import require_GET, require_POST

from taskhub.accounts.permissions import admin_required
from taskhub.mcp.oauth import AuthorizationProblem
from taskhub.mcp.oauth_browser import NeedsClient, PendingAuthorization
from taskhub.servers import connect, services
from taskhub.servers.catalogue import endpoint_of, health_of, pretty_json, tools_of
from taskhub.servers.errors import ServerConfigInvalid, ServerRemoved
from taskhub.servers.forms import ServerForm
from taskhub.servers.models import Server, ServerProcess

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
            messages.success(request, gettext("Server %(server)s added.") % {"server": server.name})
            return redirect("servers:detail", server_id=server.pk)
    status = 400 if form.is_bound else 200
    return render(request, "servers/form.html", {"form": form, "server": None}, status=status)


@admin_required
def server_edit(request, server_id):
    server = get_object_or_404(Server, pk=server_id)
    if server.removed_at is not None:
        messages.error(
            request, gettext("The server %(server)s was removed; it cannot be edited.") % {"server": server.name}
        )
        return redirect("servers:detail", server_id=server.pk)
    form = ServerForm(request.POST or None, server=server)
    if request.method == "POST" and form.is_valid():
        saved = _save(request, form, server)
        if saved is not None:
            messages.success(request, gettext("Server %(server)s saved.") % {"server": saved.name})
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
        **dict(zip(("oauth_state", "oauth_since"), connect.authorization_state(server), strict=True)),
        "oauth_wanted_scope": connect.wanted_scope(server) if server.oauth else "",
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
        messages.info(request, gettext("The server %(server)s was removed already.") % {"server": server.name})
        return redirect("servers:detail", server_id=server.pk)
    if request.method == "POST":
        if request.POST.get("confirm") != server.name:
            messages.error(
                request,
                gettext("Nothing was removed: type the server's name, %(server)s, to confirm.")
                % {"server": server.name},
            )
            return render(request, "servers/remove.html", _removal_context(server), status=400)
        services.remove_server(server=server, user=request.user)
        messages.success(
            request,
            gettext("Server %(server)s removed. Its tasks and their history stay readable.") % {"server": server.name},
        )
        return redirect("servers:list")
    return render(request, "servers/remove.html", _removal_context(server))


def _removal_context(server: Server) -> dict:
    return {
        "server": server,
        "tasks_count": server.tasks.count(),
        "followed_count": server.tasks.filter(poll__isnull=False).count(),
    }


# --- Connect through OAuth (issue 33 item 1) ----------------------------------------------------------------------

# The session keeps each Connect's state, PKCE verifier and redirect URI until its callback, by state; at most a few,
# for a few minutes (an authorization server's page is not a place to linger).
PENDING_KEY = "oauth_pending"
PENDING_SECONDS = 600
PENDING_KEPT = 5


def _connectable(server_id) -> Server:
    return get_object_or_404(Server, pk=server_id, transport="http", removed_at__isnull=True)


def _send_to_authorization(request, server: Server):
    """The first half: the admin's browser goes to the authorization server, or back to the page saying why not."""
    try:
        leg = connect.start(server=server, redirect_uri=connect.callback_url(request))
    except NeedsClient as problem:
        messages.info(request, gettext("To connect %(name)s: %(problem)s.") % {"name": server.name, "problem": problem})
        return redirect("servers:oauth_client", server_id=server.pk)
    except AuthorizationProblem as problem:
        messages.error(request, gettext("Connect failed: %(problem)s.") % {"problem": problem})
        return redirect("servers:detail", server_id=server.pk)
    if leg is None:
        messages.info(request, gettext("%(name)s answered without asking for authorization.") % {"name": server.name})
        return redirect("servers:detail", server_id=server.pk)
    now = time.time()
    kept = request.session.get(PENDING_KEY)
    kept = {
        state: entry
        for state, entry in (kept.items() if isinstance(kept, dict) else ())
        if isinstance(entry, dict) and now - entry.get("started", 0) < PENDING_SECONDS
    }
    kept[leg.pending.state] = {**leg.pending.stored(), "server_id": server.pk, "started": now}
    request.session[PENDING_KEY] = dict(sorted(kept.items(), key=lambda item: item[1]["started"])[-PENDING_KEPT:])
    # A page that moves on by itself rather than a redirect: the form's POST may not be redirected to another origin
    # (CSP form-action 'self').
    context = {
        "server": server,
        "authorization_url": leg.authorization_url,
        "host": urlsplit(leg.authorization_url).netloc,
    }
    response = render(request, "servers/oauth_go.html", context)
    response["Cache-Control"] = "no-store"
    return response


@admin_required
@require_POST
def server_connect(request, server_id):
    """Connect: authorize taskhub at the server's authorization server, in this browser."""
    return _send_to_authorization(request, _connectable(server_id))


@admin_required
def server_oauth_client(request, server_id):
    """The client id (and secret) an admin registered at an authorization server that registers none itself."""
    server = _connectable(server_id)
    redirect_uri = connect.callback_url(request)
    problem = None
    if request.method == "POST":
        client_id = request.POST.get("client_id", "").strip()
        client_secret = request.POST.get("client_secret", "").strip()
        by_itself = request.POST.get("client_credentials") == "on"
        private_key = request.POST.get("private_key", "").strip()
        try:
            if not client_id:
                raise ValueError(gettext("the client id is needed"))
            if private_key and not by_itself:
                raise ValueError(gettext("a private key is for the client credentials grant: tick “No person”"))
            if by_itself:
                connect.set_client_credentials(
                    server=server,
                    client_id=client_id,
                    client_secret=client_secret,
                    user=request.user,
                    private_key_pem=private_key,
                    jwt_algorithm=request.POST.get("jwt_algorithm", "").strip(),
                )
            else:
                connect.enter_client(
                    server=server, client_id=client_id, client_secret=client_secret, redirect_uri=redirect_uri
                )
        except ValueError as error:
            problem = str(error)
        else:
            if by_itself:
                messages.success(
                    request,
                    gettext("taskhub gets %(name)s's tokens itself now; its tools are being discovered.")
                    % {"name": server.name},
                )
                return redirect("servers:detail", server_id=server.pk)
            return _send_to_authorization(request, server)
    context = {
        "server": server,
        "redirect_uri": redirect_uri,
        "problem": problem,
        "jwt_algorithms": connect.KEY_ALGORITHMS["RS256"][1:],
    }
    return render(request, "servers/oauth_client.html", context, status=400 if problem else 200)


@admin_required
@require_GET
def oauth_callback(request):
    """Where the authorization server sends the admin back: the answer must carry the state of a Connect started in
    this session (used once), then its issuer and code are checked and the tokens kept. A refused answer changes
    nothing but forgetting that Connect."""
    kept = request.session.get(PENDING_KEY)
    kept = kept if isinstance(kept, dict) else {}
    entry = kept.pop(request.GET.get("state", ""), None)
    request.session[PENDING_KEY] = kept
    pending = PendingAuthorization.from_stored(entry)
    fresh = isinstance(entry, dict) and time.time() - entry.get("started", 0) < PENDING_SECONDS
    if pending is None or not fresh:
        return _refused(request, None, gettext("its state matches no Connect started in this browser lately"))
    server = Server.objects.filter(pk=entry.get("server_id"), removed_at__isnull=True).first()
    if server is None or server.url != pending.resource:
        return _refused(request, server, gettext("the server was removed or its URL changed meanwhile"))
    try:
        tokens = connect.finish(server=server, pending=pending, answer=dict(request.GET.items()))
    except AuthorizationProblem as problem:
        return _refused(request, server, str(problem))
    connect.record_connection(server=server, tokens=tokens, user=request.user)
    messages.success(request, gettext("Connected %(name)s; its tools are being discovered.") % {"name": server.name})
    return redirect("servers:detail", server_id=server.pk)


def _refused(request, server: Server | None, reason: str):
    logger.info("an OAuth callback was refused (server %s): %s", getattr(server, "pk", None), reason)
    return render(request, "servers/oauth_refused.html", {"server": server, "reason": reason}, status=400)


@require_GET
def oauth_client_metadata(request):
    """taskhub's Client ID Metadata Document: its URL is the client_id authorization servers fetch it by. Public (an
    authorization server reads it without signing in); served only where taskhub has a public https address."""
    document = connect.client_metadata_document()
    if not document["client_id"]:
        raise Http404("taskhub has no public https address (TASKHUB_BASE_URL)")
    return JsonResponse(document, headers={"Cache-Control": "public, max-age=3600"})
