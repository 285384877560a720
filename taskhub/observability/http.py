"""The middleware that counts HTTP requests by view and status and times them (first in MIDDLEWARE, so the time is
the whole of Django's). The view label is the URL pattern's name (`tasks:detail`), never the path: a path carries
ids, and each would be a series of its own."""

from __future__ import annotations

import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from taskhub.observability import metrics

UNMATCHED = "<unmatched>"  # no URL pattern: 404s, and requests refused before the URL was resolved


def view_name(request) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return UNMATCHED
    return match.view_name or match.route or UNMATCHED


class RequestMetrics:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        metrics.process_started("web")

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        started = time.perf_counter()
        response = self.get_response(request)
        metrics.http_request(request.method, view_name(request), response.status_code, time.perf_counter() - started)
        return response

    async def _acall(self, request):
        started = time.perf_counter()
        response = await self.get_response(request)
        metrics.http_request(request.method, view_name(request), response.status_code, time.perf_counter() - started)
        return response
