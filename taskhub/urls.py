from django.contrib import admin
from django.urls import include, path

from taskhub.api.endpoints import api

urlpatterns = [
    path("", include("taskhub.web.urls")),
    path("", include("taskhub.tasks.urls")),
    path("servers/", include("taskhub.servers.urls")),
    path("audit/", include("taskhub.audit.urls")),
    path("accounts/", include("taskhub.accounts.urls")),
    path("api/", api.urls),
    path("admin/", admin.site.urls),
]

handler404 = "taskhub.api.errors.page_not_found"
handler500 = "taskhub.api.errors.server_error"
