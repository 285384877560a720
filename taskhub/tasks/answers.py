"""Server-side checks of an answer against the input request it answers (the browser's checks are a courtesy).

A form answer's content is checked against the request's requestedSchema by taskhub.mcp.schema_fields,
the one validator (and wording) the launch form, the API and the CLI use too.
"""

from typing import Any

from django.utils.translation import gettext

from taskhub.mcp import schema_fields
from taskhub.tasks.errors import AnswerRejected
from taskhub.tasks.models import GATE_METHOD

ELICITATION_ACTIONS = ("accept", "decline", "cancel")


def validate_response(*, method: str, params: dict[str, Any], response: Any, held: bool = False) -> dict[str, Any]:
    """Return the response to send as the answer, or raise AnswerRejected.

    `held`: asked on the session of a call in flight (held_questions): a sampling request there can be refused
    (`{"action": "decline"}`, sent as the JSON-RPC error a refusal is); a task's own sampling request (the
    extension's input requests) has no way to say no."""
    if not isinstance(response, dict):
        raise AnswerRejected("The answer must be an object.")
    if method == "elicitation/create":
        return _validate_elicit_result(params or {}, response)
    if method == GATE_METHOD:
        if response.get("action") not in ELICITATION_ACTIONS:
            raise AnswerRejected(f"The action must be accept, decline or cancel, not {response.get('action')!r}.")
        if response.get("content") is not None:
            raise AnswerRejected("Approving a launch carries no content.")
        return {"action": response["action"]}
    if method == "roots/list":
        if not isinstance(response.get("roots"), list):
            raise AnswerRejected("A roots/list answer needs a list of roots.")
        return response
    if method == "sampling/createMessage":
        if held and response.get("action") in ("decline", "cancel") and set(response) <= {"action"}:
            return {"action": response["action"]}
        if "action" in response:
            raise AnswerRejected("A sampling request of a task cannot be declined here: write the reply.")
        missing = [name for name in ("role", "content", "model") if name not in response]
        if missing:
            raise AnswerRejected(f"A sampling answer needs {', '.join(missing)}.")
        if response.get("role") != "assistant":
            raise AnswerRejected("A sampling answer is the assistant's message (role assistant).")
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
        raise AnswerRejected(gettext("The answer does not fit the form:"), errors)
    return {"action": "accept", "content": content}


def content_errors(schema: Any, content: dict[str, Any]) -> dict[str, str]:
    """What is wrong with each field of an accepted form's content (empty when it fits)."""
    return schema_fields.validate(schema or {}, content, schema_fields.ELICITATION)
