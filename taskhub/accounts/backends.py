"""Django's ModelBackend, counting each guess before its password is checked and refusing it while the sign-in
rate limit is reached (ratelimit.py), so every password form, Django's admin sign-in included, obeys the limit,
however many attempts arrive at once.

The user a session signs in (every HTTP request, and a live socket at connect) is read with the names of their
role groups in the same statement and their roles kept on the object (permissions.roles_of), instead of a second
statement when the request first asks about a role: one round trip to Postgres less before every page and answer.
The object lives as long as the request; a socket re-reads its user when access changes (taskhub.live.access).
That statement is plain SQL: the ORM built and compiled the same query (an ArraySubquery over the groups) in
about 1.5 ms of Python on every request, three times what Postgres took to answer it (issue 18, item 1a).
"""

from functools import cache

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied

from taskhub.accounts import permissions, ratelimit
from taskhub.accounts.groups import ROLE_GROUPS


class RateLimitedModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if not settings.TASKHUB_LOCAL_PASSWORDS:
            return None  # local passwords are off: people sign in through the identity provider (sso.py)
        if request is None or not (username and password):
            return super().authenticate(request, username=username, password=password, **kwargs)
        with ratelimit.one_of_few_sign_ins():  # a burst of sign-ins must not take a connection each
            guessed_at, wait = ratelimit.reserve_attempt(str(username), ratelimit.client_address(request))
            if guessed_at is None:
                setattr(request, ratelimit.REFUSED_ATTRIBUTE, wait)
                raise PermissionDenied("Too many sign-in attempts.")  # authenticate() stops at once: a failure
            setattr(request, ratelimit.GUESS_ATTRIBUTE, guessed_at)
            return super().authenticate(request, username=username, password=password, **kwargs)

    def get_user(self, user_id):
        users = get_user_model()._default_manager
        user = next(iter(users.raw(_user_with_role_groups_sql(), [list(ROLE_GROUPS), user_id])), None)
        if user is None or not self.user_can_authenticate(user):
            return None
        user.taskhub_roles = permissions.roles_from(user, set(user.role_group_names))
        return user


@cache
def _user_with_role_groups_sql() -> str:
    """The user (every column of the model), `role_group_names`, the names of their role groups, and
    `taskhub_group_ids`, all their groups (permissions.group_ids_of: escalations name a group); parameters: the role
    group names, the user's id."""
    user_model = get_user_model()
    columns = ", ".join(f'u."{field.column}"' for field in user_model._meta.concrete_fields)
    return f"""
        SELECT {columns}, {permissions.role_group_names_sql("u")} AS role_group_names,
               {permissions.group_ids_sql("u")} AS taskhub_group_ids
        FROM "{user_model._meta.db_table}" u
        WHERE u."{user_model._meta.pk.column}" = %s
    """
