"""The URLconf of a gateway request answered at once (taskhub.web.request_threads.ANSWERED_AT_ONCE): the gateway's
two endpoints as sync views, then every other route as usual (reverse() inside the request finds them all). Beside
taskhub.urls, whose routes it takes."""

from django.urls import path

from taskhub.gateway import views
from taskhub.urls import urlpatterns as root_urlpatterns

urlpatterns = [
    path("mcp", views.aggregate_endpoint_at_once),
    path("mcp/servers/<str:name>", views.server_endpoint_at_once),
    *root_urlpatterns,
]
