"""An MCP server over real loopback HTTP that checks the `Mcp-Param-*` headers of every `tools/call` (SEP-2243).

Its tools mark parameters with `x-mcp-header`. For each call it works out, on its own (not with the SDK's codec
the client uses), which headers the arguments require: one per annotated argument with a value, none for a null
or absent one, none for an unannotated one, and the `=?base64?…?=` form for a value with non-ASCII or control
characters or leading/trailing whitespace. A call whose headers differ is answered with a JSON-RPC error naming
each difference; one whose headers fit is answered with the headers it got. `calls` records every call.
`listed` is what `tools/list` answers (all tools by default; tests may hide them or swap in others).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.scripted_server import DISCOVER_RESULT
from tests.threaded_app import ThreadedApp

HEADER_MISMATCH = -32020

DEPLOY = {
    "name": "deploy",
    "description": "Deploys; its routing arguments are mirrored into headers.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "priority": {"type": "integer", "x-mcp-header": "Priority"},
            "dry_run": {"type": "boolean", "x-mcp-header": "DryRun"},
            "note": {"type": "string", "x-mcp-header": "Note"},
            "target": {
                "type": "object",
                "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}},
            },
            "comment": {"type": "string"},
        },
        "required": ["region"],
    },
}
BROKEN = {
    "name": "broken",
    "description": "Its x-mcp-header sits on a number: a client must not call it.",
    "inputSchema": {"type": "object", "properties": {"score": {"type": "number", "x-mcp-header": "Score"}}},
}
TOOLS = [DEPLOY, BROKEN]

_BASE64_FORM = re.compile(r"=\?base64\?(.*)\?=")


def _annotated(schema: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    found = []
    for name, spec in (properties or {}).items():
        if isinstance(spec, dict):
            if isinstance(spec.get("x-mcp-header"), str):
                found.append(((*path, name), spec["x-mcp-header"]))
            found.extend(_annotated(spec, (*path, name)))
    return found


def _value(arguments: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        arguments = arguments.get(key) if isinstance(arguments, dict) else None
    return arguments


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _must_be_encoded(text: str) -> bool:
    return text != text.strip() or any(not 0x20 <= ord(char) <= 0x7E for char in text)


def header_problems(schema: Any, arguments: dict[str, Any], headers: dict[str, str]) -> list[str]:
    """What is wrong with the `Mcp-Param-*` headers (names lower-cased) of a call with `arguments`."""
    problems = []
    expected_names = set()
    for path, token in _annotated(schema):
        name = f"mcp-param-{token.lower()}"
        expected_names.add(name)
        value, sent = _value(arguments, path), headers.get(name)
        if value is None:
            if sent is not None:
                problems.append(f"{name} sent for a null or absent argument")
            continue
        if sent is None:
            problems.append(f"{name} missing")
            continue
        wanted = _text(value)
        if encoded := _BASE64_FORM.fullmatch(sent):
            try:
                got = base64.b64decode(encoded.group(1), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                problems.append(f"{name}: bad base64 form {sent!r}")
                continue
        elif _must_be_encoded(wanted):
            problems.append(f"{name}: {wanted!r} must be sent in the base64 form, got {sent!r}")
            continue
        else:
            got = sent
        if got != wanted:
            problems.append(f"{name}: {got!r} is not the argument {wanted!r}")
    problems += [f"{name} sent for an unannotated argument" for name in headers if name not in expected_names]
    return problems


class HeaderServer:
    def __init__(self) -> None:
        self.listed: list[dict[str, Any]] = list(TOOLS)
        self.calls: list[dict[str, Any]] = []
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> HeaderServer:
        self._served = ThreadedApp(Starlette(routes=[Route("/mcp", self._handle, methods=["POST"])]))
        self.port = self._served.start()
        return self

    def stop(self) -> None:
        self._served.stop()

    def calls_of(self, tool: str) -> list[dict[str, Any]]:
        return [call for call in self.calls if call["tool"] == tool]

    async def _handle(self, request: Request) -> Response:
        message = json.loads(await request.body())
        if "id" not in message:
            return Response(status_code=202)
        method, params = message.get("method"), message.get("params") or {}
        if method == "server/discover":
            return self._answer(message, DISCOVER_RESULT)
        if method == "tools/list":
            listing = {"resultType": "complete", "tools": self.listed, "ttlMs": 0, "cacheScope": "private"}
            return self._answer(message, listing)
        if method != "tools/call":
            return self._answer(message, error={"code": -32601, "message": "Method not found"})
        tool = next((tool for tool in TOOLS if tool["name"] == params.get("name")), None)
        if tool is None:
            return self._answer(message, error={"code": -32602, "message": "Unknown tool"})
        arguments = params.get("arguments") or {}
        headers = {name: value for name, value in request.headers.items() if name.startswith("mcp-param-")}
        problems = header_problems(tool["inputSchema"], arguments, headers)
        self.calls.append({"tool": tool["name"], "arguments": arguments, "headers": headers, "problems": problems})
        if problems:
            return self._answer(message, error={"code": HEADER_MISMATCH, "message": "; ".join(problems)})
        text = "headers checked: " + ", ".join(f"{name}={value}" for name, value in sorted(headers.items()))
        return self._answer(message, {"resultType": "complete", "content": [{"type": "text", "text": text}]})

    @staticmethod
    def _answer(message: dict[str, Any], result: Any = None, *, error: Any = None) -> Response:
        body = {"jsonrpc": "2.0", "id": message["id"], **({"error": error} if error else {"result": result})}
        return JSONResponse(body)
