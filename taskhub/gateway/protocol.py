"""JSON-RPC over Streamable HTTP as the gateway speaks it: reading a request, its `_meta` and routing headers, and
the error objects it answers with. Stateless (2026-07-28): one POST per request, answered with one JSON body."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import mcp_types
from mcp.shared.inbound import decode_header_value

from taskhub.mcp import wire

SUPPORTED_VERSIONS = (wire.PROTOCOL_VERSION,)
# The most of a request body the gateway reads; an agent's arguments or answers larger than this are refused.
MAX_BODY_BYTES = 1024 * 1024
MAX_ID_CHARS = 200
MAX_ECHOED_CHARS = 500
# Implementation-defined codes (-32000..-32019): no valid token; the token's user may not do this.
UNAUTHORIZED = -32000
FORBIDDEN = -32001


class RpcError(Exception):
    """A JSON-RPC error to answer with; `http_status` is the HTTP status of that answer."""

    def __init__(self, code: int, message: str, data: Any = None, *, http_status: int = 200) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status

    def to_wire(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def bounded(text: str, limit: int = MAX_ECHOED_CHARS) -> str:
    """Cut text that came from outside (an agent, a server) before it is echoed in an answer."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def invalid_params(message: str) -> RpcError:
    return RpcError(mcp_types.INVALID_PARAMS, bounded(message))


def task_not_found() -> RpcError:
    return invalid_params("Failed to retrieve task: Task not found")


def missing_tasks_extension() -> RpcError:
    return RpcError(
        mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY,
        "Missing required client capability",
        {"requiredCapabilities": {"extensions": {wire.EXTENSION_ID: {}}}},
        http_status=400,
    )


def method_not_found(method: str) -> RpcError:
    return RpcError(mcp_types.METHOD_NOT_FOUND, bounded(f"Method not found: {method}", 200))


def unauthorized() -> RpcError:
    return RpcError(
        UNAUTHORIZED,
        "Unauthorized: send a valid taskhub API token as 'Authorization: Bearer <token>'",
        http_status=401,
    )


@dataclass
class Call:
    """One JSON-RPC message of an agent."""

    id: str | int | None
    method: str
    params: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_notification(self) -> bool:
        return self.id is None

    @property
    def client_capabilities(self) -> dict[str, Any]:
        capabilities = self.meta.get(wire.CLIENT_CAPABILITIES_META_KEY)
        return capabilities if isinstance(capabilities, dict) else {}

    @property
    def declares_tasks(self) -> bool:
        """Whether this very request declared the Tasks extension (never inferred from earlier requests)."""
        if self.meta.get(wire.PROTOCOL_VERSION_META_KEY) not in SUPPORTED_VERSIONS:
            return False
        extensions = self.client_capabilities.get("extensions")
        return isinstance(extensions, dict) and wire.EXTENSION_ID in extensions


def request_id_of(body: bytes) -> str | int | None:
    """The id of a request body, if it has a usable one (for the error answer to a request refused early)."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    identifier = message.get("id") if isinstance(message, dict) else None
    return identifier if _usable_id(identifier) else None


def _usable_id(identifier: Any) -> bool:
    if isinstance(identifier, bool):
        return False
    return isinstance(identifier, int) or (isinstance(identifier, str) and len(identifier) <= MAX_ID_CHARS)


def parse_call(body: bytes) -> Call:
    """The request in `body`, or RpcError (-32700 unreadable JSON, -32600 not a single request)."""
    if len(body) > MAX_BODY_BYTES:
        raise RpcError(
            mcp_types.INVALID_REQUEST, f"The request is larger than {MAX_BODY_BYTES} bytes.", http_status=413
        )
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        raise RpcError(mcp_types.PARSE_ERROR, "Parse error: the body is not JSON", http_status=400) from None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        raise RpcError(mcp_types.INVALID_REQUEST, "Invalid request: expected one JSON-RPC 2.0 request", http_status=400)
    identifier = message.get("id")
    if "id" in message and not _usable_id(identifier):
        raise RpcError(mcp_types.INVALID_REQUEST, "Invalid request: a bad id", http_status=400)
    params = message.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(mcp_types.INVALID_PARAMS, "Invalid params: expected an object", http_status=400)
    meta = params.get("_meta")
    return Call(id=identifier, method=message["method"], params=params, meta=meta if isinstance(meta, dict) else {})


def check_headers(call: Call, headers: Any) -> None:
    """The routing headers must agree with the body (SEP-2243): `Mcp-Method` with the method, `Mcp-Name` with
    `params.name` (tools/call) or `params.taskId` (tasks/*). -32020, HTTP 400, if not."""
    method_header = headers.get("Mcp-Method")
    if method_header is not None and decode_header_value(method_header.strip()) != call.method:
        raise RpcError(
            mcp_types.HEADER_MISMATCH, "Mcp-Method header does not match the request body's method", http_status=400
        )
    name_param = {"tools/call": "name", "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
    param = name_param.get(call.method)
    name_header = headers.get("Mcp-Name")
    if (
        param is not None
        and name_header is not None
        and decode_header_value(name_header.strip()) != call.params.get(param)
    ):
        raise RpcError(mcp_types.HEADER_MISMATCH, f"Mcp-Name header does not match params.{param}", http_status=400)


def check_meta(call: Call) -> None:
    """Every 2026-07-28 request carries its protocol version and client capabilities in `_meta`."""
    version = call.meta.get(wire.PROTOCOL_VERSION_META_KEY)
    if version is None or wire.CLIENT_CAPABILITIES_META_KEY not in call.meta:
        raise RpcError(
            mcp_types.INVALID_PARAMS,
            f"params._meta must carry {wire.PROTOCOL_VERSION_META_KEY} and {wire.CLIENT_CAPABILITIES_META_KEY}",
            http_status=400,
        )
    if version not in SUPPORTED_VERSIONS:
        raise RpcError(
            mcp_types.UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
            {"supported": list(SUPPORTED_VERSIONS), "requested": bounded(str(version), 100)},
            http_status=400,
        )


def result_message(call_id: str | int | None, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "result": result}


def error_message(call_id: str | int | None, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "error": error.to_wire()}
