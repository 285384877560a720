"""The registry of audit event types. Recording an action not listed here raises `UnknownAuditAction`."""

from typing import Final

from django.utils.translation import gettext_noop

AUDIT_EVENTS: Final[dict[str, str]] = {
    # servers
    "server.created": gettext_noop("MCP server registered"),
    "server.updated": gettext_noop("MCP server settings changed"),
    "server.discovered": gettext_noop("MCP server capabilities and tools discovered"),
    "server.unreachable": gettext_noop("MCP server became unreachable"),
    "server.reachable": gettext_noop("MCP server reachable again"),
    "server.removed": gettext_noop("MCP server removed"),
    "server.connected": gettext_noop("MCP server connected through OAuth"),
    # tasks
    "task.launched": gettext_noop("tool call launched"),
    "task.launch_sent": gettext_noop("tool call sent to the server"),
    "task.launch_answered": gettext_noop("server answered the tool call"),
    "task.launch_failed": gettext_noop("tool call failed before any task existed"),
    "task.launch_retry_scheduled": gettext_noop(
        "all answers of an input round are in; the tool call will be sent again with them"
    ),
    "task.launch_retrying": gettext_noop("the launch could not reach the server; it will try again"),
    "task.launch_unknown": gettext_noop("launch outcome unknown"),
    "task.launch_withdrawn": gettext_noop(
        "the server refused the tool call unrun for want of authorization; it will be sent once the server is"
        " connected again"
    ),
    "task.status_changed": gettext_noop("task status changed"),
    "task.updated": gettext_noop("task details changed"),
    "task.input_requested": gettext_noop("server asked for input"),
    "task.cancel_requested": gettext_noop("cancel requested"),
    "task.bulk_cancel_requested": gettext_noop("cancel requested for many tasks at once (the query and count)"),
    "task.cancel_delivered": gettext_noop("cancel delivered to the server"),
    "task.cancel_failed": gettext_noop("the server refused the cancel"),
    "task.expired": gettext_noop("task expired"),
    "task.lost": gettext_noop("task lost: the server process or session that held it is gone"),
    "task.follower_gone": gettext_noop(
        "the worker following a 2025-11-25 task on its session went; another takes it up"
    ),
    "task.server_logged": gettext_noop("what the server logged during the call (the lines are on the task page)"),
    "task.protocol_error": gettext_noop("server sent something that contradicts the protocol"),
    "task.purged": gettext_noop("old finished task deleted by retention"),
    "task.launch_gated": gettext_noop("launch held for an approval before the call (approval policy)"),
    "task.launch_approved": gettext_noop("launch approved: the tool call goes out"),
    "task.not_approved": gettext_noop("launch not approved: the tool call was never sent"),
    # API tokens
    "api_token.created": gettext_noop("API token created"),
    "api_token.revoked": gettext_noop("API token revoked"),
    # people (taskhub/accounts/people.py)
    "person.added": gettext_noop("person added"),
    "person.groups_changed": gettext_noop("person's groups (roles) changed"),
    "person.deactivated": gettext_noop("person deactivated: sessions ended, API tokens revoked"),
    "person.reactivated": gettext_noop("person reactivated"),
    "person.password_reset": gettext_noop("person's password reset: sessions ended"),
    "person.signed_in": gettext_noop(
        "person signed in (how: a local password, or single sign-on through which provider)"
    ),
    # input requests
    "input.answered": gettext_noop("input answered"),
    "input.accepted": gettext_noop("input accepted by one of the several people its approval policy needs"),
    "input.acceptances_discounted": gettext_noop(
        "earlier acceptances that no longer count toward N of M (the policy in force "
        "when another arrived no longer allows their givers)"
    ),
    "input.delivered": gettext_noop("answer delivered to the server"),
    "input.delivery_failed": gettext_noop("the server refused the answer"),
    "input.superseded": gettext_noop("input request withdrawn by the server before it was answered"),
    "input.default_applied": gettext_noop(
        "no answer before the deadline: taskhub applied the approval policy's default"
    ),
    # approval policies
    "approval_policy.created": gettext_noop("approval policy created"),
    "approval_policy.updated": gettext_noop("approval policy changed"),
    "approval_policy.removed": gettext_noop("approval policy removed"),
    "approval_webhook.created": gettext_noop("webhook of an approval policy added"),
    "approval_webhook.updated": gettext_noop("webhook of an approval policy changed"),
    "approval_webhook.removed": gettext_noop("webhook of an approval policy removed"),
    "approval_webhook.delivery_failed": gettext_noop(
        "a webhook delivery was given up (the receiver refused it, or never answered)"
    ),
    # notifications
    "notification.preferences_changed": gettext_noop("mail notification preferences changed"),
    "notification.mail_sent": gettext_noop("notification digest mailed"),
    "notification.mail_given_up": gettext_noop(
        "notification mail given up (its address refused for good, or every try failed)"
    ),
    # the audit trail itself
    "audit.exported": gettext_noop("audit trail exported"),
    "audit.archived": gettext_noop("a month of the audit trail archived to a file (its rows and chain head)"),
    "audit.partition_dropped": gettext_noop(
        "an archived month of the audit trail dropped by retention (the database owner)"
    ),
}


class UnknownAuditAction(ValueError):
    pass


def check_action(action: str) -> str:
    if action not in AUDIT_EVENTS:
        raise UnknownAuditAction(f"{action!r} is not a registered audit event type (see taskhub/audit/events.py)")
    return action
