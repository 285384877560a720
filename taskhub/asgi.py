"""ASGI entry point: Django for HTTP; the WebSocket route joins here when taskhub/live/ exists."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskhub.settings")

# Set up Django (and its app registry) before importing anything that touches models.
django_http_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_http_app,
        # "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(live_websocket_urlpatterns))),
    }
)
