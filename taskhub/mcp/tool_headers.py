"""Custom headers from tool parameters (SEP-2243, protocol revision 2026-07-28).

A tool's `inputSchema` may mark parameters with `x-mcp-header: Name`; a `tools/call` over HTTP then mirrors each
such argument into an `Mcp-Param-Name` header (base64 form `=?base64?…?=` for non-ASCII, control characters or
leading/trailing whitespace; no header for a null or absent value), and a client must not call a tool whose
annotations are invalid (not a token, on a non-primitive or `number` property, duplicated, off the plain
`properties` chain). All of it is the SDK's own public code (`mcp.shared.inbound`), also used by its server side
to check the headers; this module only names the problem in words a person can act on and bounds what an
untrusted schema can make us print.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.shared.inbound import find_invalid_x_mcp_header, mcp_param_headers, x_mcp_header_map

__all__ = ["MAX_PROBLEM", "header_problem", "param_headers"]

MAX_PROBLEM = 300


def header_problem(input_schema: Any) -> str | None:
    """What is wrong with the `x-mcp-header` annotations of `input_schema` (one line), or None when they are valid
    or absent. Never raises, whatever the schema."""
    try:
        reason = find_invalid_x_mcp_header(input_schema)
    except (RecursionError, ValueError, TypeError) as error:  # an absurd schema is a problem too
        reason = f"the input schema cannot be read ({type(error).__name__})"
    if reason is None:
        return None
    reason = " ".join(reason.split())
    return reason if len(reason) <= MAX_PROBLEM else reason[: MAX_PROBLEM - 1] + "…"


def param_headers(input_schema: Any, arguments: Mapping[str, Any]) -> dict[str, str]:
    """The `Mcp-Param-*` headers of a `tools/call` with `arguments`, for a schema `header_problem` accepts."""
    if header_problem(input_schema) is not None:
        return {}
    return mcp_param_headers(x_mcp_header_map(input_schema), arguments)
