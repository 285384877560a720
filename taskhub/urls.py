from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("taskhub.web.urls")),
    path("accounts/", include("taskhub.accounts.urls")),
    path("admin/", admin.site.urls),
]
