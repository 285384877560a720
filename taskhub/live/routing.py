from django.urls import path

from taskhub.live.consumer import LiveConsumer

LIVE_SOCKET_PATH = "/ws/live/"

websocket_urlpatterns = [
    path(LIVE_SOCKET_PATH.lstrip("/"), LiveConsumer.as_asgi()),
]
