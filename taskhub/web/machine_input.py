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
import re

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse

# JSON that can decode to a NUL or a lone surrogate says so in an escape (raw, neither is valid JSON text or UTF-8):
# only a body with one is decoded here, so the views' own parse is not done twice on every request.
MAY_DECODE_UNSTORABLE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
API_PREFIX = "/api/"
GATEWAY_PREFIX = "/mcp"
JSON_RPC_INVALID_PARAMS = -32602
JSON_RPC_INVALID_REQUEST = -32600


def unstorable(value, depth: int = 0) -> bool:
    """Whether a decoded JSON value holds a NUL or a lone surrogate in any string, key or value."""
    return bool(unstorable_paths(value, depth=depth))


def unstorable_paths(value, path: str = "", depth: int = 0) -> list[str]:
    """The dotted paths of the strings (or keys) in `value` that hold a NUL or a lone surrogate ("" for the value
    itself); at most a few."""
    if depth > 200:
        return [path]  # nothing taskhub stores nests so deep
    if isinstance(value, str):
        return [path] if _bad_text(value) else []
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            found += [where] if _bad_text(str(key)) else unstorable_paths(item, where, depth + 1)
            if len(found) >= 5:
                break
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += unstorable_paths(item, f"{path}.{index}" if path else str(index), depth + 1)
            if len(found) >= 5:
                break
    return found


def _api_field(path: str) -> str:
    """A path as the API's other errors name fields: a tool's argument or a form's field by its own name."""
    first, _, rest = path.partition(".")
    return rest if first in ("arguments", "content") and rest else path or "body"


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
        if body and request.content_type == "application/json" and MAY_DECODE_UNSTORABLE.search(body):
            try:
                data = json.loads(body)
            except (ValueError, RecursionError):
                data = None  # the view says what it makes of it (ninja 400, the gateway -32700)
            paths = unstorable_paths(data) if data is not None else []
            if paths:
                request_id = data.get("id") if isinstance(data, dict) and not unstorable(data.get("id")) else None
                why = "The request contains text that cannot be stored: a NUL character or a lone surrogate."
                fields = {_api_field(path): "contains a NUL character or a lone surrogate" for path in paths}
                return _refused(gateway, request_id, 400, why, fields)
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


def _refused(gateway: bool, request_id, status: int, why: str, fields: dict | None = None) -> JsonResponse:
    if gateway:
        code = JSON_RPC_INVALID_PARAMS if status == 400 else JSON_RPC_INVALID_REQUEST
        message = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": why}}
        return JsonResponse(message, status=status)
    return JsonResponse({"error": why, "fields": fields or {}}, status=status)
