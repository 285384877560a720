from django.contrib import admin
from django.urls import include, path

from taskhub.api import policies  # noqa: F401  (registers /api/approval-policies on the API)
from taskhub.api.endpoints import api

urlpatterns = [
    # First: an agent's request is resolved before anything else is tried, and its resolver match (kept with each
    # open subscriptions/listen stream) holds no list of the routes tried before it (bench/gateway.py --listen).
    path("", include("taskhub.gateway.urls")),
    path("", include("taskhub.web.urls")),
    path("", include("taskhub.tasks.urls")),
    path("servers/", include("taskhub.servers.urls")),
    path("approvals/", include("taskhub.approvals.urls")),
    path("audit/", include("taskhub.audit.urls")),
    path("accounts/", include("taskhub.accounts.urls")),
    path("people/", include("taskhub.accounts.people_urls")),
    path("account/notifications/", include("taskhub.approvals.notifications.urls")),
    path("tokens/", include("taskhub.api.urls")),
    path("api/", api.urls),
    path("admin/", admin.site.urls),
    path("", include("taskhub.observability.urls")),
]

handler404 = "taskhub.api.errors.page_not_found"
handler500 = "taskhub.api.errors.server_error"
