"""Text Postgres cannot store, found before it reaches the database (where it is a DataError, a 500).

NUL (U+0000) is allowed in neither text nor jsonb; a lone surrogate (U+D800-U+DFFF, which JSON's "\\ud800" escape
produces) has no UTF-8 encoding. Both arrive in launch arguments and answers typed into the JSON box or sent to
the API. The services refuse them (services.launch, services.answer_input); forms may call `unstorable_fields`
first to put the message next to the field.
"""

from typing import Any

NUL_PROBLEM = "contains a NUL character (U+0000), which cannot be stored"
SURROGATE_PROBLEM = "contains a lone surrogate (U+D800 to U+DFFF), which is not valid Unicode and cannot be stored"
# Deeper than any JSON the request parsers accept; past it the value is refused rather than walked.
MAX_DEPTH = 1_000


def text_problem(text: str) -> str | None:
    """What makes this string unstorable, or None."""
    if "\x00" in text:
        return NUL_PROBLEM
    if any("\ud800" <= char <= "\udfff" for char in text):
        return SURROGATE_PROBLEM
    return None


def value_problem(value: Any) -> str | None:
    """The first problem anywhere in a JSON-like value (strings, keys, lists, objects), or None."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            return "is nested too deeply to be stored"
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return problem
        elif isinstance(item, dict):
            for key, nested in item.items():
                pending.append((key, depth + 1))
                pending.append((nested, depth + 1))
        elif isinstance(item, (list, tuple)):
            pending.extend((nested, depth + 1) for nested in item)
    return None


def unstorable_fields(values: dict[str, Any]) -> dict[str, str]:
    """Problems keyed by top-level name, as form errors are; a name that is itself unstorable is reported under ""
    (the name is never echoed back)."""
    problems: dict[str, str] = {}
    for name, value in values.items():
        name_problem = value_problem(name)
        if name_problem:
            problems.setdefault("", f"A field name {name_problem}.")
            continue
        problem = value_problem(value)
        if problem:
            problems[str(name)] = f"This value {problem}."
    return problems
