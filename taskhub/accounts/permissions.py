"""Who may do what: the one place roles are decided, used by views, the API and the WebSocket consumer.

Roles are memberships of the groups created by the accounts migration (groups.py):

- approver (`approvers`): answers the input requests of the servers they approve for. A server with
  approver groups set is answered only by approvers who are also in one of those groups (membership
  of such a group alone is not enough); a server without any is answered by every approver.
- operator (`operators`): launches tool calls on enabled servers and cancels tasks.
- admin (`admins`, or a superuser): manages servers and their approver groups, reads and exports the
  audit trail, and is an operator too. An admin is **not** an approver unless also in `approvers`:
  DESIGN.md gives answering a server's question to approvers alone, so it is granted explicitly,
  never implied by power.

Anonymous and inactive users have no role. Nothing here caches across requests: a long-lived WebSocket connection
sees a membership change on its next check. Within one HTTP request the roles are read once (roles_once_per_request
in taskhub/accounts/middleware.py): a page asks in its view, its filters, its nav and its template. These functions
answer "may this user?", never "is this the right moment?" (an input request already answered, a task already
finished): the services decide that.
"""

from contextvars import ContextVar
from dataclasses import dataclass
from functools import wraps
from inspect import iscoroutinefunction

from asgiref.sync import sync_to_async
from django.contrib.auth.mixins import UserPassesTestMixin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, QuerySet

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS, ROLE_GROUPS
from taskhub.servers.models import Server


@dataclass(frozen=True)
class Roles:
    admin: bool = False
    operator: bool = False
    approver: bool = False


NO_ROLES = Roles()

# {user id: Roles} for the HTTP request being answered; None outside one (sockets, workers, tests calling directly).
roles_this_request: ContextVar[dict[int, Roles] | None] = ContextVar("roles_this_request", default=None)


def roles_of(user) -> Roles:
    """All three roles in one query (pages ask for several: the context processor exposes this as `roles`)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NO_ROLES
    pinned = getattr(user, "taskhub_roles", None)
    if pinned is not None:
        return pinned
    known = roles_this_request.get()
    if known is not None and user.pk in known:
        return known[user.pk]
    names = set(user.groups.filter(name__in=ROLE_GROUPS).values_list("name", flat=True))
    admin = user.is_superuser or ADMINS in names
    roles = Roles(admin=admin, operator=admin or OPERATORS in names, approver=APPROVERS in names)
    if known is not None:
        known[user.pk] = roles
    return roles


def with_roles_read_once(user):
    """Read `user`'s roles now and keep them on this object, which then answers every role question without a query.

    Only for a user object whose holder reads it again when the roles may have changed: the live socket, which
    replaces its user on `access.changed` (taskhub.live.access) and renders each change with it (the fragments
    ask up to eight times per change: bench/freshness.py)."""
    user.taskhub_roles = roles_of(user)
    return user


def is_admin(user) -> bool:
    return roles_of(user).admin


def is_operator(user) -> bool:
    return roles_of(user).operator


def is_approver(user) -> bool:
    return roles_of(user).approver


def servers_user_may_approve(user) -> QuerySet[Server]:
    """The servers whose input requests this user may answer; a queryset, so the inbox can filter by it."""
    if not is_approver(user):
        return Server.objects.none()
    memberships = Server.approver_groups.through.objects.filter(server=OuterRef("pk"))
    return Server.objects.filter(~Exists(memberships) | Exists(memberships.filter(group__user=user)))


def sees_all_tasks(user) -> bool:
    """Operators (and so admins) watch every task; the live socket's `tasks` group follows this too."""
    return is_operator(user)


def may_see_task(user, task) -> bool:
    if sees_all_tasks(user):
        return True
    return servers_user_may_approve(user).filter(pk=task.server_id).exists()


def may_answer(user, input_request) -> bool:
    return servers_user_may_approve(user).filter(pk=input_request.task.server_id).exists()


def may_cancel(user, task) -> bool:
    return is_operator(user)


def may_launch(user, server) -> bool:
    return server.enabled and is_operator(user)


def _role_required(has_role, who: str):
    """Anonymous users go to the login page; signed-in users without the role get 403 saying who may."""
    refusal = f"This page is for {who}."

    def decorator(view):
        if iscoroutinefunction(view):

            @wraps(view)
            async def async_view(request, *args, **kwargs):
                user = await request.auser()
                if not user.is_authenticated:
                    return redirect_to_login(request.get_full_path())
                if not await sync_to_async(has_role)(user):
                    raise PermissionDenied(refusal)
                return await view(request, *args, **kwargs)

            return async_view

        @wraps(view)
        def sync_view(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not has_role(request.user):
                raise PermissionDenied(refusal)
            return view(request, *args, **kwargs)

        return sync_view

    return decorator


approver_required = _role_required(is_approver, "approvers")
operator_required = _role_required(is_operator, "operators")
admin_required = _role_required(is_admin, "admins")


class _RoleRequiredMixin(UserPassesTestMixin):
    # UserPassesTestMixin already sends anonymous users to login and answers others with 403.
    has_role = staticmethod(lambda user: False)
    who = "nobody"

    def test_func(self) -> bool:
        return self.has_role(self.request.user)

    def get_permission_denied_message(self) -> str:
        return f"This page is for {self.who}."


class ApproverRequiredMixin(_RoleRequiredMixin):
    has_role = staticmethod(is_approver)
    who = "approvers"


class OperatorRequiredMixin(_RoleRequiredMixin):
    has_role = staticmethod(is_operator)
    who = "operators"


class AdminRequiredMixin(_RoleRequiredMixin):
    has_role = staticmethod(is_admin)
    who = "admins"
