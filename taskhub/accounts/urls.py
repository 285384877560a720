from django.urls import path

from taskhub.accounts import views

app_name = "accounts"

urlpatterns = [
    path("login/", views.SignInView.as_view(), name="login"),
    path("logout/", views.SignOutView.as_view(), name="logout"),
    path("language/", views.choose_language, name="language"),
]
