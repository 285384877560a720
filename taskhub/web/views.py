from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from taskhub.accounts.permissions import is_admin
from taskhub.web.health import database_status


@require_GET
def home(request):
    # htmx refreshes only the status fragment; a plain request gets the whole page.
    template = "web/home.html#system-status" if request.htmx else "web/home.html"
    return render(request, template, {"database": database_status(with_version=_admin(request))})


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
