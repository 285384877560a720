"""ASGI entry point: Django for HTTP, the live socket (/ws/live/) for WebSocket."""

import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskhub.settings")

# Set up Django (and its app registry) before importing anything that touches models, as get_asgi_application does.
django.setup(set_prefix=False)

from taskhub.web.request_threads import KeptRequestThreads, OneTripHandler  # noqa: E402

django_http_app = OneTripHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from taskhub.live.origin import SameOriginValidator  # noqa: E402
from taskhub.live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": KeptRequestThreads(django_http_app),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Python's cyclic garbage collector, tuned for a long-running process holding thousands of live sockets. With the
# default thresholds (700, 10, 10), pushing one change to a process's 1,000 sockets ran young collections dozens
# of times, each traversing what the sockets hold: bench/fanout.py (2,000 sockets over two daphnes, quiet machine)
# measured 0.70 daphne CPU-seconds per change and a p99 of 1,392 ms, and with this 0.38 s and 364 ms (as with no
# collection at all). What Django and the app loaded at start is frozen: it lives as long as the process and is
# never traversed again. Garbage in cycles is still collected, less often.
GC_YOUNG_THRESHOLD = 50_000
gc.freeze()
gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
