"""The registry of audit event types. Recording an action not listed here raises `UnknownAuditAction`."""

from typing import Final

AUDIT_EVENTS: Final[dict[str, str]] = {
    # servers
    "server.created": "MCP server registered",
    "server.updated": "MCP server settings changed",
    "server.discovered": "MCP server capabilities and tools discovered",
    "server.unreachable": "MCP server became unreachable",
    "server.reachable": "MCP server reachable again",
    "server.removed": "MCP server removed",
    # tasks
    "task.launched": "tool call launched",
    "task.launch_sent": "tool call sent to the server",
    "task.launch_answered": "server answered the tool call",
    "task.launch_failed": "tool call failed before any task existed",
    "task.launch_retry_scheduled": "all answers of an input round are in; the tool call will be sent again with them",
    "task.launch_retrying": "the launch could not reach the server; it will try again",
    "task.launch_unknown": "launch outcome unknown",
    "task.status_changed": "task status changed",
    "task.updated": "task details changed",
    "task.input_requested": "server asked for input",
    "task.cancel_requested": "cancel requested",
    "task.bulk_cancel_requested": "cancel requested for many tasks at once (the query and count)",
    "task.cancel_delivered": "cancel delivered to the server",
    "task.cancel_failed": "the server refused the cancel",
    "task.expired": "task expired",
    "task.lost": "task lost: the server process or session that held it is gone",
    "task.follower_gone": "the worker following a 2025-11-25 task on its session went; another takes it up",
    "task.server_logged": "what the server logged during the call (the lines are on the task page)",
    "task.protocol_error": "server sent something that contradicts the protocol",
    "task.purged": "old finished task deleted by retention",
    "task.launch_gated": "launch held for an approval before the call (approval policy)",
    "task.launch_approved": "launch approved: the tool call goes out",
    "task.not_approved": "launch not approved: the tool call was never sent",
    # API tokens
    "api_token.created": "API token created",
    "api_token.revoked": "API token revoked",
    # people (taskhub/accounts/people.py)
    "person.added": "person added",
    "person.groups_changed": "person's groups (roles) changed",
    "person.deactivated": "person deactivated: sessions ended, API tokens revoked",
    "person.reactivated": "person reactivated",
    "person.password_reset": "person's password reset: sessions ended",
    "person.signed_in": "person signed in (how: a local password, or single sign-on through which provider)",
    # input requests
    "input.answered": "input answered",
    "input.accepted": "input accepted by one of the several people its approval policy needs",
    "input.acceptances_discounted": "earlier acceptances that no longer count toward N of M (the policy in force "
    "when another arrived no longer allows their givers)",
    "input.delivered": "answer delivered to the server",
    "input.delivery_failed": "the server refused the answer",
    "input.superseded": "input request withdrawn by the server before it was answered",
    "input.default_applied": "no answer before the deadline: taskhub applied the approval policy's default",
    # approval policies
    "approval_policy.created": "approval policy created",
    "approval_policy.updated": "approval policy changed",
    "approval_policy.removed": "approval policy removed",
    "approval_webhook.created": "webhook of an approval policy added",
    "approval_webhook.updated": "webhook of an approval policy changed",
    "approval_webhook.removed": "webhook of an approval policy removed",
    "approval_webhook.delivery_failed": "a webhook delivery was given up (the receiver refused it, or never answered)",
    # notifications
    "notification.preferences_changed": "mail notification preferences changed",
    "notification.mail_sent": "notification digest mailed",
    "notification.mail_given_up": "notification mail given up (its address refused for good, or every try failed)",
    # the audit trail itself
    "audit.exported": "audit trail exported",
    "audit.archived": "a month of the audit trail archived to a file (its rows and chain head)",
    "audit.partition_dropped": "an archived month of the audit trail dropped by retention (the database owner)",
}


class UnknownAuditAction(ValueError):
    pass


def check_action(action: str) -> str:
    if action not in AUDIT_EVENTS:
        raise UnknownAuditAction(f"{action!r} is not a registered audit event type (see taskhub/audit/events.py)")
    return action
