"""ASGI entry point: Django for HTTP, the live socket (/ws/live/) for WebSocket."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskhub.settings")

# Set up Django (and its app registry) before importing anything that touches models.
django_http_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from taskhub.live.origin import SameOriginValidator  # noqa: E402
from taskhub.live.routing import websocket_urlpatterns  # noqa: E402
from taskhub.web.request_threads import KeptRequestThreads  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": KeptRequestThreads(django_http_app),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
