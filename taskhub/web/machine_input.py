"""What the machine routes (the JSON API under /api/, the MCP gateway under /mcp) cannot take is answered there, as
JSON, before any view sees it: a 400 or a 413, never a 500 or Django's HTML page (issue 31, point 5).

- Text no column can store: a NUL or a lone surrogate (`\\ud800`) in the path or anywhere in a JSON body. Postgres
  refuses NUL in text and psycopg cannot encode a lone surrogate, so such a value used to end in a DataError or a
  UnicodeEncodeError (500) wherever it reached a query: a server's name, a policy's tool, a webhook's URL, a tool's
  name through the gateway.
- A body over DATA_UPLOAD_MAX_MEMORY_SIZE (RequestDataTooBig): 413.
- A 405 of the API (ninja's is an empty HTML response): JSON, with its Allow header.

The gateway's answers are JSON-RPC error objects (with the request's id when it can be read), the API's its
`{"error": …, "fields": …}` problems.
"""

import json

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse

API_PREFIX = "/api/"
GATEWAY_PREFIX = "/mcp"
JSON_RPC_INVALID_PARAMS = -32602
JSON_RPC_INVALID_REQUEST = -32600


def unstorable(value, depth: int = 0) -> bool:
    """Whether a decoded JSON value holds a NUL or a lone surrogate in any string, key or value."""
    if depth > 200:
        return True  # nothing taskhub stores nests so deep
    if isinstance(value, str):
        return _bad_text(value)
    if isinstance(value, dict):
        return any(_bad_text(key) or unstorable(item, depth + 1) for key, item in value.items())
    if isinstance(value, list):
        return any(unstorable(item, depth + 1) for item in value)
    return False


def _bad_text(text: str) -> bool:
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_errors_for_machines(get_response):
    def middleware(request):
        path = request.path_info
        gateway = path == GATEWAY_PREFIX or path.startswith(GATEWAY_PREFIX + "/")
        if not gateway and not path.startswith(API_PREFIX):
            return get_response(request)
        if _bad_text(path):
            return _refused(gateway, None, 400, "The address contains a character that is not allowed (NUL).")
        try:
            body = request.body
        except RequestDataTooBig:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            return _refused(gateway, None, 413, f"The request body is larger than {limit} bytes.")
        if body and request.content_type == "application/json":
            try:
                data = json.loads(body)
            except (ValueError, RecursionError):
                data = None  # the view says what it makes of it (ninja 400, the gateway -32700)
            if data is not None and unstorable(data):
                request_id = data.get("id") if isinstance(data, dict) and not unstorable(data.get("id")) else None
                why = "The request contains text that cannot be stored: a NUL character or a lone surrogate."
                return _refused(gateway, request_id, 400, why)
        response = get_response(request)
        if (
            not gateway
            and response.status_code == 405
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            allowed = response.get("Allow", "")
            refused = JsonResponse({"error": f"{request.method} is not allowed here.", "fields": {}}, status=405)
            if allowed:
                refused["Allow"] = allowed
            return refused
        return response

    return middleware


def _refused(gateway: bool, request_id, status: int, why: str) -> JsonResponse:
    if gateway:
        code = JSON_RPC_INVALID_PARAMS if status == 400 else JSON_RPC_INVALID_REQUEST
        message = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": why}}
        return JsonResponse(message, status=status)
    return JsonResponse({"error": why, "fields": {}}, status=status)
