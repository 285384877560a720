"""Channel-layer group names. Group names allow ASCII letters, digits, hyphens, underscores and periods."""

import uuid

# Every task change: operators and admins.
TASKS_GROUP = "tasks"


def task_group(task_id: uuid.UUID | str) -> str:
    """One task's changes, for pages that show it (the detail page asks with {"watch": "<uuid>"})."""
    return f"task.{task_id}"


def inbox_group(server_id: int) -> str:
    """Changes to tasks of one server that have (or had) input requests: its approvers' inboxes."""
    return f"inbox.server.{server_id}"


# A server's tool list as agents see it may have changed (enabled, disabled, discovered, renamed, removed): the
# gateway's `subscriptions/listen` streams that listen for toolsListChanged.
CATALOGUE_GROUP = "catalogue"

# Every socket: told to read its access again when anyone's may have changed (servers' approver groups).
ACCESS_GROUP = "access"


def user_group(user_id: int) -> str:
    """A user's sockets: told to read their access again after their roles or memberships changed."""
    return f"user.{user_id}"
