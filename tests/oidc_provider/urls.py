from django.contrib.auth import views as auth_views
from django.http import HttpResponse
from django.urls import include, path

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("favicon.ico", lambda request: HttpResponse(status=204)),
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
]
