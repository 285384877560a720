"""Whether a URL-mode request's link may be opened from taskhub, and why not."""

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.utils.translation import gettext

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True)
class UrlTarget:
    url: str
    host: str
    clickable: bool
    problem: str = ""


def url_target(value: Any) -> UrlTarget:
    """Whether a URL-mode request may be opened: https anywhere, http only on a loopback host (development)."""
    url = value if isinstance(value, str) else ""
    if not url.strip():
        return UrlTarget(url=url, host="", clickable=False, problem=gettext("The server sent no URL."))
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return UrlTarget(url=url, host="", clickable=False, problem=gettext("This is not a well-formed URL."))
    if any(ch.isspace() or ord(ch) < 32 for ch in url.strip()):
        problem = gettext("The URL contains spaces or control characters.")
        return UrlTarget(url=url, host=host, clickable=False, problem=problem)
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        return UrlTarget(
            url=url,
            host=host,
            clickable=False,
            problem=gettext("taskhub opens only https: links, not %(scheme)s: ones; decline or cancel this request.")
            % {"scheme": scheme or "scheme-less"},
        )
    if not host:
        return UrlTarget(url=url, host="", clickable=False, problem=gettext("The URL names no host."))
    if scheme == "https":
        return UrlTarget(url=url, host=host, clickable=True)
    if scheme == "http" and _is_loopback(host):
        return UrlTarget(url=url, host=host, clickable=True)
    return UrlTarget(
        url=url,
        host=host,
        clickable=False,
        problem=gettext(
            "taskhub opens only https: links (http: only on this machine, for development); "
            "decline or cancel this request."
        ),
    )


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
