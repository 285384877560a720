"""Who is told: the people who may answer a request, or the person who launched a task, with an email address and the
preference on."""

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet

from taskhub.accounts.groups import ADMINS
from taskhub.accounts.permissions import answer_terms, users_who_may_answer
from taskhub.approvals.models import NotificationKind

DEFAULT_ON = {
    NotificationKind.REQUEST_WAITING: True,
    NotificationKind.DEADLINE_NEAR: True,
    NotificationKind.DEFAULT_APPLIED: True,
    NotificationKind.TASK_FINISHED: False,
    NotificationKind.SERVER_NEEDS_AUTHORIZATION: True,  # no switch: always
}


def _reachable(users: QuerySet, kind: str) -> QuerySet:
    """Those of `users` who are active, have an address and want `kind` (a person without preferences: its default)."""
    users = users.filter(is_active=True).exclude(email="")
    if DEFAULT_ON[NotificationKind(kind)]:
        return users.exclude(**{f"notification_preferences__{kind}": False})
    return users.filter(**{f"notification_preferences__{kind}": True})


def answerers(
    *, server_id: int, tool: str, escalated_to_id: int | None, launched_by_id: int | None, kind: str
) -> list[int]:
    """The ids of the people who may answer a request of `tool` on the server, escalated to a group or not
    (taskhub.accounts.permissions.users_who_may_answer, the query may_answer asks too), minus the launcher where the
    policy refuses self-approval, who have an address and want `kind`."""
    users = users_who_may_answer(server_id=server_id, tool=tool, escalated_to_id=escalated_to_id)
    if launched_by_id is not None and not answer_terms(server_id=server_id, tool=tool).self_approval:
        users = users.exclude(pk=launched_by_id)
    return sorted(set(_reachable(users, kind).values_list("pk", flat=True)))


def launcher(*, launched_by_id: int | None, kind: str) -> list[int]:
    if launched_by_id is None:
        return []
    users = get_user_model().objects.filter(pk=launched_by_id)
    return list(_reachable(users, kind).values_list("pk", flat=True))


def admins() -> list[int]:
    """Every active admin (in `admins`, or a superuser) with an address."""
    users = get_user_model().objects.filter(Q(is_superuser=True) | Q(groups__name=ADMINS))
    return sorted(set(users.filter(is_active=True).exclude(email="").values_list("pk", flat=True)))
