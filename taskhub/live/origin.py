"""The live socket's Origin check: the one Django's CSRF check makes for a form POST.

A browser sends the page's origin (scheme, host and port) with a WebSocket handshake, and any page may open a
socket to any host with the user's cookies. Channels' AllowedHostsOriginValidator compares host names only, so a
page on another port of the same host (another app, a dev server) could read the live updates. Here the origin
must be the request's own (the scheme Django sees, honouring SECURE_PROXY_SSL_HEADER, and the Host header, which
must be in ALLOWED_HOSTS), or listed in CSRF_TRUSTED_ORIGINS: exactly what CsrfViewMiddleware accepts.
"""

from channels.security.websocket import WebsocketDenier
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware


class _HandshakeRequest(HttpRequest):
    """The handshake as Django sees a request: headers in META, the scheme from the socket (ws/wss)."""

    def __init__(self, scope) -> None:
        super().__init__()
        self._secure_socket = scope.get("scheme") == "wss"
        server = scope.get("server") or ("", "")
        self.META = {"SERVER_NAME": str(server[0] or ""), "SERVER_PORT": str(server[1] or "")}
        self.repeated_headers: set[str] = set()
        for name, value in scope.get("headers", []):
            key = "HTTP_" + name.decode("latin1").upper().replace("-", "_")
            if key in self.META:
                self.repeated_headers.add(key)
            self.META[key] = value.decode("latin1")

    def _get_scheme(self) -> str:
        return "https" if self._secure_socket else "http"


def origin_is_allowed(scope) -> bool:
    request = _HandshakeRequest(scope)
    if not request.META.get("HTTP_ORIGIN") or request.repeated_headers & {"HTTP_ORIGIN", "HTTP_HOST"}:
        return False  # no Origin (not a browser page: a stolen cookie alone opens nothing), or an ambiguous one
    # Django's own comparison (CsrfViewMiddleware._origin_verified), made with the settings of this moment.
    return CsrfViewMiddleware(lambda request: None)._origin_verified(request)


class SameOriginValidator:
    """ASGI middleware for WebSocket connections: a handshake from any other origin is refused (HTTP 403)."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator is for WebSocket connections only")
        if origin_is_allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
