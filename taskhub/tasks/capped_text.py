"""Text from a server or a task, capped for a page: as it is, as indented JSON, or as one line of compact JSON."""

import json
from dataclasses import dataclass
from typing import Any

TEXT_CAP = 20_000  # characters of one text item, embedded resource text, or JSON shown
JSON_CAP = 20_000
EVENT_DATA_CAP = 300  # the compact JSON of one timeline entry


@dataclass
class Capped:
    text: str
    truncated: bool = False
    total: int = 0


def cap(text: Any, limit: int = TEXT_CAP) -> Capped:
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    if len(text) <= limit:
        return Capped(text, False, len(text))
    return Capped(text[:limit], True, len(text))


def pretty_json(value: Any, limit: int = JSON_CAP) -> Capped:
    try:
        compact = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return cap(repr(value), limit)
    if len(compact) > PRETTY_KEPT_CHARS:
        return cap(_indented(value), limit)
    text = _pretty_kept.get(compact)
    if text is None:
        if len(_pretty_kept) >= PRETTY_KEPT:
            _pretty_kept.clear()
        text = _pretty_kept[compact] = _indented(value)
    return cap(text, limit)


def _indented(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


# Indented JSON is written by json's pure-Python encoder (the C one writes only compact JSON): 8.4 µs for a task's few
# arguments, 3.5 kept, on each of the inbox's 50 cards. What one compact text holds indents the same, so the indented
# text is kept by the compact one, which the C encoder writes at a third of the cost; only short ones (the process
# keeps at most PRETTY_KEPT of at most PRETTY_KEPT_CHARS, some 6 MB at worst).
PRETTY_KEPT = 1000
PRETTY_KEPT_CHARS = 2000
_pretty_kept: dict[str, str] = {}


def compact_json(value: Any, limit: int = EVENT_DATA_CAP) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
