from django.urls import path

from taskhub.approvals.notifications import views

app_name = "notifications"

urlpatterns = [
    path("", views.preferences, name="preferences"),
]
