from django.urls import path

from taskhub.approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.policy_list, name="list"),
    path("add/", views.policy_add, name="add"),
    path("<int:policy_id>/edit/", views.policy_edit, name="edit"),
    path("<int:policy_id>/remove", views.policy_remove, name="remove"),
    path("<int:policy_id>/webhooks/add", views.webhook_add, name="webhook_add"),
    path("<int:policy_id>/webhooks/<int:webhook_id>/switch", views.webhook_switch, name="webhook_switch"),
    path("<int:policy_id>/webhooks/<int:webhook_id>/remove", views.webhook_remove, name="webhook_remove"),
]
