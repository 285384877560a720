from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("taskhub.web.urls")),
    path("", include("taskhub.tasks.urls")),
    path("servers/", include("taskhub.servers.urls")),
    path("audit/", include("taskhub.audit.urls")),
    path("accounts/", include("taskhub.accounts.urls")),
    path("admin/", admin.site.urls),
]
