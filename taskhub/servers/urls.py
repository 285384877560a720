from django.urls import path

from taskhub.servers import views

app_name = "servers"

urlpatterns = [
    path("", views.server_list, name="list"),
    path("add/", views.server_add, name="add"),
    path("<int:server_id>/", views.server_detail, name="detail"),
    path("<int:server_id>/edit/", views.server_edit, name="edit"),
    path("<int:server_id>/discover", views.server_discover, name="discover"),
    path("<int:server_id>/discovery/", views.server_discovery, name="discovery"),
    path("<int:server_id>/remove/", views.server_remove, name="remove"),
    path("<int:server_id>/process/", views.server_process, name="process"),
    path("<int:server_id>/connect", views.server_connect, name="connect"),
    path("<int:server_id>/connect/client/", views.server_oauth_client, name="oauth_client"),
    path("oauth/callback", views.oauth_callback, name="oauth_callback"),
    path("oauth/client-metadata.json", views.oauth_client_metadata, name="oauth_client_metadata"),
]
