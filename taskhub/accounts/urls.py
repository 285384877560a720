from django.urls import path

from taskhub.accounts import sso, views

app_name = "accounts"

urlpatterns = [
    path("login/", views.SignInView.as_view(), name="login"),
    path("logout/", views.SignOutView.as_view(), name="logout"),
    path("sso/", sso.SsoRequestView.as_view(), name="sso"),
    path("sso/callback/", sso.SsoCallbackView.as_view(), name="sso_callback"),
    path("language/", views.choose_language, name="language"),
]
