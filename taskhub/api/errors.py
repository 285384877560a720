"""Django's error pages for what ninja never sees: a URL under /api/ that matches no endpoint, an exception
raised before the endpoint runs (middleware). Under /api/ they are JSON like every other API error; elsewhere
Django's own pages."""

import sys

from django.db import InterfaceError, OperationalError
from django.http import JsonResponse
from django.views import defaults

API_PREFIX = "/api/"


def _is_api(request) -> bool:
    return request.path_info.startswith(API_PREFIX)


def page_not_found(request, exception):
    if _is_api(request):
        return JsonResponse({"error": "No such API endpoint.", "fields": {}}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request):
    if not _is_api(request):
        return defaults.server_error(request)
    # Called while Django handles the exception, so it is still the current one.
    if isinstance(sys.exc_info()[1], (OperationalError, InterfaceError)):
        response = JsonResponse({"error": "The database cannot be reached; try again in a moment.", "fields": {}})
        response.status_code, response["Retry-After"] = 503, "10"
        return response
    return JsonResponse({"error": "Something went wrong on the server; it has been logged.", "fields": {}}, status=500)
