"""ASGI entry point: Django for HTTP, the live socket (/ws/live/) for WebSocket."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskhub.settings")

# Set up Django (and its app registry) before importing anything that touches models, as get_asgi_application does.
django.setup(set_prefix=False)

from taskhub.web.request_threads import KeptRequestThreads, OneTripHandler  # noqa: E402

django_http_app = OneTripHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from taskhub.gateway import direct  # noqa: E402
from taskhub.live.origin import SameOriginValidator  # noqa: E402
from taskhub.live.routing import websocket_urlpatterns  # noqa: E402
from taskhub.runtime import tune_garbage_collector  # noqa: E402
from taskhub.web.daphne_requests import no_form_parsing_in_daphne  # noqa: E402
from taskhub.web.proxies import behind_trusted_proxies  # noqa: E402

# The client's address is decided once, for every route and protocol: from forwarding headers only when the peer is
# a trusted proxy (TASKHUB_TRUSTED_PROXIES).
application = behind_trusted_proxies(
    ProtocolTypeRouter(
        {
            "http": KeptRequestThreads(django_http_app, direct_answers={direct.METHOD: direct.answer_tasks_get}),
            "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)

tune_garbage_collector()
no_form_parsing_in_daphne()
