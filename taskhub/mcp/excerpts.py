"""How much of a server's own text an error message may quote: a short, printable excerpt, never the reply.

A reply that is not MCP (a JSON body of some other service, a proxy's page) ends in the server's last error and
in task errors, which operators and approvers read; the SDK's and pydantic's messages quote the reply at length
(pydantic's `input_value=…`). Errors built from such text quote at most :data:`EXCERPT_CHARS` printable characters.
"""

from __future__ import annotations

from pydantic import ValidationError

EXCERPT_CHARS = 80


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    """`text` with control and other unprintable characters dropped, whitespace runs made one space, at most `limit`
    characters (… at the end when cut)."""
    printable = "".join(char if char.isprintable() else " " for char in str(text))
    flat = " ".join(printable.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def validation_summary(error: ValidationError) -> str:
    """A pydantic error without the input it quotes: the first problem's place and message, and how many more."""
    problems = error.errors(include_input=False, include_url=False)
    if not problems:
        return "the answer does not match the protocol"
    first = problems[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "answer"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"the answer does not match the protocol: {excerpt(where, 40)}: {excerpt(first.get('msg', ''))}{more}"


def describe_exception(error: BaseException) -> str:
    """An exception for an error message: its type and a short excerpt of what it says."""
    if isinstance(error, ValidationError):
        return validation_summary(error)
    return f"{type(error).__name__}: {excerpt(error, 200)}".rstrip(": ")
