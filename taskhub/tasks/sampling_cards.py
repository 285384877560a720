"""A sampling request (`sampling/createMessage`) as a person reads and answers it: the conversation the server wants a
model's message for, and the person's reply as that message (templates/tasks/input_request_card.html, input_cards)."""

from dataclasses import dataclass
from typing import Any

from django.utils.translation import gettext

from taskhub.tasks.errors import AnswerRejected

SAMPLING_MESSAGES_SHOWN = 20
SAMPLING_TEXT_MAX_CHARS = 4000
REPLY_MAX_CHARS = 100_000
# The `model` a person's reply names: the server asked for a model's message and should know it did not get one.
PERSON_AS_MODEL = "a person, through taskhub"


@dataclass(frozen=True)
class SamplingMessage:
    role: str
    text: str


@dataclass(frozen=True)
class SamplingView:
    """What a sampling request asks, as a person reads it (every value from the server, capped)."""

    messages: list[SamplingMessage]
    more_messages: int
    system_prompt: str
    limits: list[tuple[str, str]]  # ("max tokens", "100"), ("temperature", "0.7"), …


def sampling_view(params: dict[str, Any]) -> SamplingView:
    raw_messages = params.get("messages") if isinstance(params.get("messages"), list) else []
    messages = [
        SamplingMessage(
            role=capped(message.get("role"), 20), text=capped(_content_text(message), SAMPLING_TEXT_MAX_CHARS)
        )
        for message in raw_messages[:SAMPLING_MESSAGES_SHOWN]
        if isinstance(message, dict)
    ]
    limits = []
    for key, label in (("maxTokens", "max tokens"), ("temperature", "temperature"), ("includeContext", "context")):
        if isinstance(params.get(key), int | float | str) and not isinstance(params.get(key), bool):
            limits.append((label, capped(params[key], 40)))
    preferences = params.get("modelPreferences") if isinstance(params.get("modelPreferences"), dict) else {}
    hints = [
        h.get("name") for h in preferences.get("hints") or [] if isinstance(h, dict) and isinstance(h.get("name"), str)
    ]
    if hints:
        limits.append(("models hinted", capped(", ".join(hints), 200)))
    stops = params.get("stopSequences")
    if isinstance(stops, list) and stops:
        limits.append(("stop sequences", capped(", ".join(repr(stop) for stop in stops[:10]), 200)))
    return SamplingView(
        messages=messages,
        more_messages=max(0, len(raw_messages) - SAMPLING_MESSAGES_SHOWN),
        system_prompt=capped(params.get("systemPrompt"), SAMPLING_TEXT_MAX_CHARS),
        limits=limits,
    )


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    blocks = content if isinstance(content, list) else [content]
    parts = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif isinstance(block, dict):
            parts.append(f"[{capped(block.get('type'), 20) or 'unknown'} content, not shown]")
    return "\n".join(parts)


def sampling_reply(data) -> dict[str, Any]:
    """A person's reply to a sampling request, as the model's message (CreateMessageResult)."""
    reply = str(data.get("reply", "")).strip()
    if not reply:
        raise AnswerRejected(
            gettext("Write the reply the model would give (or decline)."), {"reply": gettext("Write the reply.")}
        )
    if len(reply) > REPLY_MAX_CHARS:
        raise AnswerRejected(gettext("The reply is longer than %(count)s characters.") % {"count": REPLY_MAX_CHARS})
    return {
        "role": "assistant",
        "content": {"type": "text", "text": reply},
        "model": PERSON_AS_MODEL,
        "stopReason": "endTurn",
    }


def capped(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"
