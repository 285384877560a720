"""The outbound address policy of MCP servers, from the settings (see TASKHUB_SERVER_* in taskhub/settings.py)."""

from __future__ import annotations

import functools
import os
from urllib.parse import urlsplit

from django.conf import settings
from django.core.signals import setting_changed
from django.db import connections
from django.dispatch import receiver

from taskhub.mcp.address_policy import DEFAULT_DENIED_HOSTS, DEFAULT_DENIED_NETWORKS, AddressPolicy

POLICY_SETTINGS = frozenset(
    {
        "TASKHUB_SERVER_DENIED_NETWORKS",
        "TASKHUB_SERVER_DENIED_HOSTS",
        "TASKHUB_SERVER_ALLOWED_NETWORKS",
        "TASKHUB_SERVER_DENY_OWN_SERVICES",
        "DATABASES",
        "REDIS_URL",
    }
)


def own_service_endpoints() -> list[tuple[str, int]]:
    """host:port of taskhub's own database(s) and Redis: no MCP server lives there."""
    endpoints = []
    for alias in connections:
        database = connections[alias].settings_dict
        host = str(database.get("HOST") or "")
        if host and not host.startswith("/"):
            endpoints.append((host, int(database.get("PORT") or 5432)))
    redis_url = getattr(settings, "REDIS_URL", None) or os.environ.get("REDIS_URL", "").strip()
    if redis_url:
        parts = urlsplit(redis_url)
        if parts.hostname:
            endpoints.append((parts.hostname, parts.port or 6379))
    return endpoints


@functools.cache
def server_address_policy() -> AddressPolicy:
    return AddressPolicy.build(
        denied_networks=[*DEFAULT_DENIED_NETWORKS, *settings.TASKHUB_SERVER_DENIED_NETWORKS],
        denied_hosts=[*DEFAULT_DENIED_HOSTS, *settings.TASKHUB_SERVER_DENIED_HOSTS],
        allowed_networks=settings.TASKHUB_SERVER_ALLOWED_NETWORKS,
        denied_endpoints=own_service_endpoints() if settings.TASKHUB_SERVER_DENY_OWN_SERVICES else (),
    )


@receiver(setting_changed)
def _forget_the_policy(*, setting, **kwargs) -> None:
    if setting in POLICY_SETTINGS:
        server_address_policy.cache_clear()
