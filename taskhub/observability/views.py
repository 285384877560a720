"""`/metrics`: the Prometheus text format, for a scraper that presents TASKHUB_METRICS_TOKEN as a bearer token
(401 otherwise) and/or comes from TASKHUB_METRICS_ALLOWED_NETWORKS (403 otherwise). With neither setting, it is
refused to everyone (403): metrics name servers and workers, so they are not public by default."""

from __future__ import annotations

import hmac
import ipaddress
from functools import cache

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from taskhub.observability.collectors import DatabaseCollector
from taskhub.observability.metrics import MULTIPROCESS_DIR

NOT_CONFIGURED = "Metrics are off: set TASKHUB_METRICS_TOKEN or TASKHUB_METRICS_ALLOWED_NETWORKS.\n"


@require_GET
def metrics(request):
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)


def _refusal(request) -> HttpResponse | None:
    token = settings.TASKHUB_METRICS_TOKEN
    networks = _allowed_networks(tuple(settings.TASKHUB_METRICS_ALLOWED_NETWORKS))
    if not token and not networks:
        return HttpResponse(NOT_CONFIGURED, status=403, content_type="text/plain")
    if networks and not _address_allowed(request.META.get("REMOTE_ADDR", ""), networks):
        return HttpResponse("Your address may not read the metrics.\n", status=403, content_type="text/plain")
    if token:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), token.encode()):
            response = HttpResponse("A bearer token is required.\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return None


@cache
def _allowed_networks(networks: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


def _address_allowed(address: str, networks: tuple) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in networks)


class _ThisProcess:
    """The process's own registry, as one collector of the scrape's registry."""

    def collect(self):
        return REGISTRY.collect()


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    if MULTIPROCESS_DIR is not None:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    registry.register(DatabaseCollector())
    return registry
