"""Who may receive what over the live socket, decided by taskhub.accounts.permissions and read fresh each time."""

from dataclasses import dataclass

from taskhub.accounts import permissions


@dataclass(frozen=True)
class LiveAccess:
    sees_all_tasks: bool
    approvable_server_ids: frozenset[int]

    def may_see_task(self, task) -> bool:
        # The rule of permissions.may_see_task / tasks_visible_to, from what was read once per message.
        return self.sees_all_tasks or task.server_id in self.approvable_server_ids


NO_ACCESS = LiveAccess(sees_all_tasks=False, approvable_server_ids=frozenset())


def access_for(user) -> LiveAccess:
    """What this user may see live. Inactive or anonymous users see nothing."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NO_ACCESS
    return LiveAccess(
        sees_all_tasks=permissions.sees_all_tasks(user),
        approvable_server_ids=frozenset(permissions.servers_user_may_approve(user).values_list("pk", flat=True)),
    )
