from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.utils import timezone
from django.utils.functional import SimpleLazyObject
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from taskhub.accounts.permissions import is_admin
from taskhub.live.nav import nav_counts
from taskhub.tasks.dashboard import dashboard
from taskhub.tasks.trends import trends
from taskhub.web.health import database_status


@require_GET
def home(request):
    """Anonymous visitors get the public page; signed-in people their dashboard (taskhub/tasks/dashboard.py).
    htmx refreshes a fragment: the dashboard (?fragment=dashboard, after a live change), the trends (?fragment=trends,
    taskhub/tasks/trends.py) or the system status."""
    signed_in = request.user.is_authenticated
    # One moment for the dashboard and the trends: they share what ended (trend_hours.ended_per_hour).
    now = timezone.now()
    if signed_in and request.GET.get("fragment") == "dashboard":
        return render(request, "web/dashboard.html#dashboard", {"board": dashboard(request.user, now=now)})
    if signed_in and request.GET.get("fragment") == "trends":
        return render(request, "web/dashboard.html#trends", {"trends": trends(request.user, now=now)})
    context = {"database": database_status(with_version=_admin(request))}
    if request.htmx:
        return render(request, "web/home.html#system-status", context)
    if signed_in:
        board = dashboard(request.user, now=now)
        # The nav's Inbox count is the board's "waiting for me" (tasks/waiting.py), counted once for both.
        waiting = board.waiting.count if board.waiting is not None else None
        nav = SimpleLazyObject(lambda: nav_counts(request.user, waiting=waiting))
        context |= {"board": board, "trends": trends(request.user, now=now), "nav_counts": nav}
        return render(request, "web/dashboard.html", context)
    return render(request, "web/home.html", context)


@require_GET
@never_cache
def healthz(request):
    database = database_status(with_version=_admin(request))
    healthy = database["ok"]
    return JsonResponse({"status": "ok" if healthy else "error", "database": database}, status=200 if healthy else 503)


def _admin(request) -> bool:
    return request.user.is_authenticated and is_admin(request.user)


@require_GET
def favicon(request):
    # Browsers ask for /favicon.ico whatever the page declares.
    return redirect(static("taskhub/favicon.svg"), permanent=True)
