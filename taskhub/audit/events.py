"""The registry of audit event types. Recording an action not listed here raises `UnknownAuditAction`."""

from typing import Final

AUDIT_EVENTS: Final[dict[str, str]] = {
    # servers
    "server.created": "MCP server registered",
    "server.updated": "MCP server settings changed",
    "server.discovered": "MCP server capabilities and tools discovered",
    "server.unreachable": "MCP server became unreachable",
    "server.reachable": "MCP server reachable again",
    # tasks
    "task.launched": "tool call launched",
    "task.launch_sent": "tool call sent to the server",
    "task.launch_answered": "server answered the tool call",
    "task.launch_failed": "tool call failed before any task existed",
    "task.launch_retry_scheduled": "all answers of an input round are in; the tool call will be sent again with them",
    "task.launch_unknown": "launch outcome unknown",
    "task.status_changed": "task status changed",
    "task.updated": "task details changed",
    "task.input_requested": "server asked for input",
    "task.cancel_requested": "cancel requested",
    "task.cancel_delivered": "cancel delivered to the server",
    "task.cancel_failed": "the server refused the cancel",
    "task.expired": "task expired",
    "task.protocol_error": "server sent something that contradicts the protocol",
    "task.purged": "old finished task deleted by retention",
    # API tokens
    "api_token.created": "API token created",
    "api_token.revoked": "API token revoked",
    # input requests
    "input.answered": "input answered",
    "input.delivered": "answer delivered to the server",
    "input.delivery_failed": "the server refused the answer",
    "input.superseded": "input request withdrawn by the server before it was answered",
    # the audit trail itself
    "audit.exported": "audit trail exported",
}


class UnknownAuditAction(ValueError):
    pass


def check_action(action: str) -> str:
    if action not in AUDIT_EVENTS:
        raise UnknownAuditAction(f"{action!r} is not a registered audit event type (see taskhub/audit/events.py)")
    return action
