"""The baseline ASGI app of bench/fanout.py: the same transport as /ws/live/ without any rendering.

Served by daphne like taskhub.asgi, with the same middleware (origin check, session authentication) and the same
Redis channel layer; its consumer joins one group on connect and forwards a tiny group message as it is. What
bench/fanout.py measures on it is the transport (Redis channel layer, daphne, WebSocket) alone.

    daphne bench.fanout_baseline:application    # started by bench/fanout.py, from the repository root
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskhub.settings")
django_http_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

GROUP = "bench-fanout-baseline"


class PingConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        await self.send(text_data="hello")

    async def disconnect(self, code):
        await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def bench_ping(self, event):
        await self.send(text_data=event["text"])


application = ProtocolTypeRouter(
    {
        "http": django_http_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([path("ws/live/", PingConsumer.as_asgi())]))
        ),
    }
)
