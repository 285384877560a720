"""Typed errors of the MCP client. Every failure a caller can act on has its own class."""

from __future__ import annotations

from typing import Any

INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022


class McpClientError(Exception):
    """Base of every error the client raises."""


class ProtocolError(McpClientError):
    """The server answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None, *, method: str | None = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{message} (code {code})")

    def to_error_object(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class TaskNotFound(ProtocolError):
    """The server does not know the task id, or the task expired (-32602 on a `tasks/*` request)."""


class MissingCapability(ProtocolError):
    """The server requires a client capability the request did not declare (-32021)."""

    @property
    def required_capabilities(self) -> dict[str, Any]:
        data = self.data if isinstance(self.data, dict) else {}
        required = data.get("requiredCapabilities")
        return required if isinstance(required, dict) else {}


class MethodNotFound(ProtocolError):
    """The server does not implement the method (-32601)."""


class AuthorizationFailed(ProtocolError):
    """The server refused the request's credentials (HTTP 401 or 403)."""


class InvalidResult(McpClientError):
    """The server's answer breaks the protocol (unknown resultType, a task result where none may be, …)."""


class InvalidToolDefinition(McpClientError):
    """The server describes the tool in a way that forbids calling it (invalid `x-mcp-header` annotations): the
    client refuses before sending anything."""


class RequestTimeout(McpClientError):
    """No answer within the request's timeout."""


class TransportError(McpClientError):
    """The connection failed (refused, reset, process exited). The next call reconnects by itself."""


class AuthorizationProblem(Exception):
    """Authorization to the server could not be completed (a person's settings, or the authorization server).
    Raised inside a request's OAuth flow (taskhub.mcp.oauth), before the request is sent or after the server refused
    it (HTTP 401, 403 insufficient_scope). `method`: the JSON-RPC method of that request, once the flow knows it."""

    method: str | None = None


class AuthorizationIncomplete(TransportError):
    """The request's OAuth authorization could not be completed (an AuthorizationProblem in the flow of that very
    request, not of another on its connection): the server refused it (HTTP 401, or 403 insufficient_scope) or it was
    never sent. Either way the server did not run it. (AuthorizationFailed is a refusal with no OAuth flow to try:
    static credentials.)"""


class IncompleteAnswer(TransportError):
    """The server began to answer, but the body broke off or did not finish in time.

    The server is reachable, so this says more about the answer than about the server's health.
    """


def protocol_error(code: int, message: str, data: Any = None, *, method: str | None = None) -> ProtocolError:
    """The typed error for a JSON-RPC error answer to `method`."""
    if code == MISSING_REQUIRED_CLIENT_CAPABILITY:
        return MissingCapability(code, message, data, method=method)
    if code == METHOD_NOT_FOUND:
        return MethodNotFound(code, message, data, method=method)
    if code == INVALID_PARAMS and method in ("tasks/get", "tasks/update", "tasks/cancel"):
        return TaskNotFound(code, message, data, method=method)
    return ProtocolError(code, message, data, method=method)
