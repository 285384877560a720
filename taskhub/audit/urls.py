from django.urls import path

from taskhub.audit import views

app_name = "audit"

urlpatterns = [
    path("", views.audit_list, name="list"),
    path("export.<str:fmt>", views.audit_export, name="export"),
    path("verify", views.audit_verify, name="verify"),
]
