"""Django's ModelBackend, counting each guess before its password is checked and refusing it while the sign-in
rate limit is reached (ratelimit.py), so every password form, Django's admin sign-in included, obeys the limit,
however many attempts arrive at once.

The user a session signs in (every HTTP request, and a live socket at connect) is read with the names of their
role groups in the same statement and their roles kept on the object (permissions.roles_of), instead of a second
statement when the request first asks about a role: one round trip to Postgres less before every page and answer.
The object lives as long as the request; a socket re-reads its user when access changes (taskhub.live.access).
"""

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group
from django.contrib.postgres.expressions import ArraySubquery
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef

from taskhub.accounts import permissions, ratelimit
from taskhub.accounts.groups import ROLE_GROUPS


class RateLimitedModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
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
        role_groups = Group.objects.filter(user=OuterRef("pk"), name__in=ROLE_GROUPS).values("name")
        users = get_user_model()._default_manager.annotate(role_group_names=ArraySubquery(role_groups))
        try:
            user = users.get(pk=user_id)
        except users.model.DoesNotExist:
            return None
        if not self.user_can_authenticate(user):
            return None
        user.taskhub_roles = permissions.roles_from(user, set(user.role_group_names))
        return user
