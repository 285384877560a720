"""Server-side checks of an answer against the input request it answers (the browser's checks are a courtesy).

Form-mode elicitation schemas are flat objects of primitives (MCP 2026-07-28): string (formats email,
uri, date, date-time; minLength/maxLength), number / integer (minimum/maximum), boolean, single-select
(string `enum` or `oneOf` of `const`s) and multi-select (array of those, minItems/maxItems). Each
problem is reported per field in words a person can act on.
"""

import datetime
import re
from typing import Any
from urllib.parse import urlsplit

from taskhub.tasks.errors import AnswerRejected

ELICITATION_ACTIONS = ("accept", "decline", "cancel")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def validate_response(*, method: str, params: dict[str, Any], response: Any) -> dict[str, Any]:
    """Return the response to send as the answer, or raise AnswerRejected."""
    if not isinstance(response, dict):
        raise AnswerRejected("The answer must be an object.")
    if method == "elicitation/create":
        return _validate_elicit_result(params or {}, response)
    if method == "roots/list":
        if not isinstance(response.get("roots"), list):
            raise AnswerRejected("A roots/list answer needs a list of roots.")
        return response
    if method == "sampling/createMessage":
        missing = [name for name in ("role", "content", "model") if name not in response]
        if missing:
            raise AnswerRejected(f"A sampling answer needs {', '.join(missing)}.")
        return response
    raise AnswerRejected(f"taskhub cannot answer requests of kind {method!r}.")


def _validate_elicit_result(params: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    action = response.get("action")
    if action not in ELICITATION_ACTIONS:
        raise AnswerRejected(f"The action must be accept, decline or cancel, not {action!r}.")
    content = response.get("content")
    if action != "accept" or (params.get("mode") or "form") == "url":
        if content is not None:
            raise AnswerRejected(
                "Only an accepted form answer carries content."
                if action != "accept"
                else "Accepting a URL request means consenting to open it; it carries no content."
            )
        return {"action": action}
    if content is None:
        content = {}
    if not isinstance(content, dict):
        raise AnswerRejected("The form content must be an object of field values.")
    schema = params.get("requestedSchema") or {}
    errors = content_errors(schema, content)
    if errors:
        raise AnswerRejected("The answer does not fit the form:", errors)
    return {"action": "accept", "content": content}


def content_errors(schema: dict[str, Any], content: dict[str, Any]) -> dict[str, str]:
    properties: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    errors: dict[str, str] = {}
    for name in content:
        if name not in properties:
            errors[name] = "this field was not asked for"
    for name, field_schema in properties.items():
        if name not in content or content[name] is None:
            if name in required:
                errors[name] = "this field is required"
            continue
        problem = field_error(field_schema or {}, content[name])
        if problem:
            errors[name] = problem
    return errors


def field_error(schema: dict[str, Any], value: Any) -> str | None:
    kind = schema.get("type")
    if kind == "string":
        return _string_error(schema, value)
    if kind in ("number", "integer"):
        return _number_error(schema, value, integer=kind == "integer")
    if kind == "boolean":
        return None if isinstance(value, bool) else "must be true or false"
    if kind == "array":
        return _multi_select_error(schema, value)
    return f"taskhub cannot check a field of type {kind!r}"


def _choices(schema: dict[str, Any]) -> list[Any] | None:
    if "enum" in schema:
        return list(schema["enum"])
    options = schema.get("oneOf") or schema.get("anyOf")
    if options:
        return [option.get("const") for option in options if isinstance(option, dict)]
    return None


def _string_error(schema: dict[str, Any], value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be text"
    choices = _choices(schema)
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(map(str, choices))}"
    min_length, max_length = schema.get("minLength"), schema.get("maxLength")
    if min_length is not None and len(value) < min_length:
        return f"must be at least {min_length} characters long"
    if max_length is not None and len(value) > max_length:
        return f"must be at most {max_length} characters long"
    expected = schema.get("format")
    if expected and not _has_format(expected, value):
        return FORMAT_HINTS.get(expected, f"must be a valid {expected}")
    return None


FORMAT_HINTS = {
    "email": "must be an email address like name@example.com",
    "uri": "must be an absolute URI like https://example.com/page",
    "date": "must be a date like 2026-07-28",
    "date-time": "must be a date and time with a time zone, like 2026-07-28T14:30:00Z",
}


def _has_format(expected: str, value: str) -> bool:
    if expected == "email":
        return bool(EMAIL.match(value))
    if expected == "uri":
        parts = urlsplit(value)
        return bool(parts.scheme) and bool(parts.netloc or parts.path) and " " not in value
    if expected == "date":
        try:
            datetime.date.fromisoformat(value)
        except ValueError:
            return False
        return len(value) == 10
    if expected == "date-time":
        try:
            moment = datetime.datetime.fromisoformat(value)
        except ValueError:
            return False
        return "T" in value.upper() and moment.tzinfo is not None
    return True  # an unknown format is the server's to check


def _number_error(schema: dict[str, Any], value: Any, *, integer: bool) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a whole number" if integer else "must be a number"
    if integer and not (isinstance(value, int) or value.is_integer()):
        return "must be a whole number"
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    if minimum is not None and value < minimum:
        return f"must be at least {minimum}"
    if maximum is not None and value > maximum:
        return f"must be at most {maximum}"
    return None


def _multi_select_error(schema: dict[str, Any], value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return "must be a list of choices"
    choices = _choices(schema.get("items") or {})
    if choices is not None:
        unknown = [item for item in value if item not in choices]
        if unknown:
            return f"{', '.join(unknown)} not among the choices ({', '.join(map(str, choices))})"
    if len(set(value)) != len(value):
        return "each choice may be picked once"
    min_items, max_items = schema.get("minItems"), schema.get("maxItems")
    if min_items is not None and len(value) < min_items:
        return f"pick at least {min_items}"
    if max_items is not None and len(value) > max_items:
        return f"pick at most {max_items}"
    return None
