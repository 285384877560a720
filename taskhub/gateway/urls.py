from django.urls import path

from taskhub.gateway import views

app_name = "gateway"
urlpatterns = [
    path("mcp", views.aggregate_endpoint, name="aggregate"),
    path("mcp/servers/<str:name>", views.server_endpoint, name="server"),
]
