"""Who may receive what over the live socket.

`access_for` is the one place that decides. It asks taskhub.accounts.permissions (the project's one
source of roles); the stand-in below, with the same rules, only serves while that module is absent.
"""

from dataclasses import dataclass

from taskhub.servers.models import Server

OPERATORS_GROUP = "operators"
ADMINS_GROUP = "admins"
APPROVERS_GROUP = "approvers"


@dataclass(frozen=True)
class LiveAccess:
    sees_all_tasks: bool
    approvable_server_ids: frozenset[int]

    def may_see_task(self, task) -> bool:
        return self.sees_all_tasks or task.server_id in self.approvable_server_ids


NO_ACCESS = LiveAccess(sees_all_tasks=False, approvable_server_ids=frozenset())


def access_for(user) -> LiveAccess:
    """What this user may see live, read fresh from the database. Inactive or anonymous users see nothing."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NO_ACCESS
    try:
        from taskhub.accounts import permissions
    except ImportError:
        permissions = None
    if permissions is not None:
        return LiveAccess(
            sees_all_tasks=bool(permissions.is_operator(user)),
            approvable_server_ids=frozenset(permissions.servers_user_may_approve(user).values_list("pk", flat=True)),
        )
    return _stand_in_access(user)


def _stand_in_access(user) -> LiveAccess:
    group_names = set(user.groups.values_list("name", flat=True))
    approvable_ids: frozenset[int] = frozenset()
    if APPROVERS_GROUP in group_names:
        approvable = Server.objects.filter(approver_groups__isnull=True) | Server.objects.filter(
            approver_groups__user=user
        )
        approvable_ids = frozenset(approvable.values_list("pk", flat=True).distinct())
    return LiveAccess(
        sees_all_tasks=user.is_superuser or bool(group_names & {OPERATORS_GROUP, ADMINS_GROUP}),
        approvable_server_ids=approvable_ids,
    )
