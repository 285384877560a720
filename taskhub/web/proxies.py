"""The client's address behind a proxy: believed from forwarding headers only when the proxy is one taskhub trusts.

daphne's `--proxy-headers` takes the leftmost X-Forwarded-For from whoever connects, so any client could name any
address: a new one per request escaped the sign-in limit per address, and a private one passed /metrics' networks
(issue 31, point 2). Here the headers count only when the direct peer is in TASKHUB_TRUSTED_PROXIES (addresses or
networks), and the client is the rightmost address of X-Forwarded-For that is not a trusted proxy (each proxy
appends the peer it saw; what a client wrote itself stands left of it). X-Forwarded-Proto from a trusted proxy
sets the scheme. With no trusted proxy configured the headers are ignored and the client is the peer daphne sees.

uvicorn's ProxyHeadersMiddleware does exactly this (it arrives with the `mcp` SDK, which serves over uvicorn); it
wraps the whole ASGI application, so Django's REMOTE_ADDR, the live socket's scope, the sign-in limit and /metrics'
networks all read the one address it decides (the audit trail records no address; daphne's own access log names
the peer it sees, the proxy).
"""

from django.conf import settings
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware


def behind_trusted_proxies(application, proxies: list[str] | None = None):
    """`application`, believing forwarding headers from `proxies` (default: the setting, each entry an address or a
    network, checked at start-up by settings.trusted_proxies_from_env) only; as it is with none."""
    proxies = settings.TASKHUB_TRUSTED_PROXIES if proxies is None else proxies
    if not proxies:
        return application
    return ProxyHeadersMiddleware(application, trusted_hosts=list(proxies))
