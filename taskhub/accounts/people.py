"""People, for admins (issue 34, Deliver 2): add a person, set their groups (roles and approver groups), deactivate and
reactivate them, reset their password. Each change is one function and one transaction, writing the user and its
audit row; the pages (people_views.py) and `manage.py people` both call these.

Deactivating someone ends everything they had open: their sessions are deleted (their next page is the sign-in), their
live sockets close (saving the user tells them: taskhub.live.access re-reads an inactive user as no one) and their API
tokens are revoked (the api app's tokens, named by label: accounts sits below api). A reset password ends their
sessions and sockets too (the session's password hash no longer matches).

Bad input raises PeopleRefused with a message for the person and changes nothing: a name taken, an admin deactivating
themselves, the last active admin losing the role.
"""

import secrets

from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext

from taskhub.accounts.groups import ADMINS
from taskhub.audit.services import record_event

PASSWORD_BYTES = 15  # 20 characters of URL-safe base64
COMMAND = "manage.py people"  # the actor of a change made from the command line (by=None)


class PeopleRefused(ValueError):
    """What an admin asked cannot be done; the message says why and what to do."""


def new_password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def _record(action: str, by, data: dict) -> None:
    record_event(action=action, user=by, actor_label=None if by is not None else COMMAND, data=data)


def _names(groups) -> list[str]:
    return sorted(group.name for group in groups)


def _active_admins_besides(user) -> int:
    others = get_user_model().objects.filter(is_active=True).exclude(pk=user.pk)
    return others.filter(groups__name=ADMINS).union(others.filter(is_superuser=True)).count()


def _is_admin(user, groups) -> bool:
    return user.is_superuser or ADMINS in {group.name for group in groups}


@transaction.atomic
def add_person(*, username: str, email: str = "", groups=(), by, password: str | None = None):
    """A new, active person in `groups`; returns (user, password): the password is theirs to change, shown once."""
    username = username.strip()
    users = get_user_model()
    if not username:
        raise PeopleRefused(gettext("A username is required."))
    if users.objects.filter(**{f"{users.USERNAME_FIELD}__iexact": username}).exists():
        raise PeopleRefused(
            gettext("The username “%(username)s” is taken: pick another, or edit that person.") % {"username": username}
        )
    password = password or new_password()
    user = users.objects.create_user(username=username, email=email.strip(), password=password)
    groups = list(groups)
    user.groups.set(groups)
    _record("person.added", by, {"person": username, "groups": _names(groups)})
    return user, password


@transaction.atomic
def set_groups(*, user, groups, by):
    """`user` in exactly these groups (roles and approver groups alike)."""
    user = get_user_model().objects.select_for_update(no_key=True).get(pk=user.pk)
    groups = list(groups)
    before = _names(user.groups.all())
    demoted = user.is_active and _is_admin(user, user.groups.all()) and not _is_admin(user, groups)
    if demoted and _active_admins_besides(user) == 0:
        raise PeopleRefused(
            gettext("%(person)s is the last active admin: make someone else admin first.")
            % {"person": user.get_username()}
        )
    user.groups.set(groups)
    after = _names(groups)
    if before != after:
        _record("person.groups_changed", by, {"person": user.get_username(), "from": before, "to": after})
    return user


@transaction.atomic
def deactivate_person(*, user, by) -> dict:
    """`user` can no longer sign in or use a token; what they had open ends. Returns what was ended."""
    user = get_user_model().objects.select_for_update(no_key=True).get(pk=user.pk)
    if by is not None and user.pk == by.pk:
        raise PeopleRefused("You cannot deactivate yourself: ask another admin.")
    if not user.is_active:
        raise PeopleRefused(f"{user.get_username()} is deactivated already.")
    if _is_admin(user, user.groups.all()) and _active_admins_besides(user) == 0:
        raise PeopleRefused(
            gettext("%(person)s is the last active admin: make someone else admin first.")
            % {"person": user.get_username()}
        )
    user.is_active = False
    user.save(update_fields=["is_active"])  # its sockets hear this (taskhub.live.access) and close
    sessions = _end_sessions(user)
    tokens = _revoke_tokens(user, by)
    ended = {"sessions": sessions, "tokens": tokens}
    _record("person.deactivated", by, {"person": user.get_username(), **ended})
    return ended


@transaction.atomic
def reactivate_person(*, user, by):
    user = get_user_model().objects.select_for_update(no_key=True).get(pk=user.pk)
    if user.is_active:
        raise PeopleRefused(f"{user.get_username()} is active already.")
    user.is_active = True
    user.save(update_fields=["is_active"])
    # Their tokens stay revoked: they make new ones.
    _record("person.reactivated", by, {"person": user.get_username()})
    return user


@transaction.atomic
def reset_password(*, user, by, password: str | None = None) -> str:
    """A new password for `user` (shown once to the admin, to hand over); their sessions and sockets end."""
    user = get_user_model().objects.select_for_update(no_key=True).get(pk=user.pk)
    password = password or new_password()
    user.set_password(password)
    user.save(update_fields=["password"])
    sessions = _end_sessions(user)
    _record("person.password_reset", by, {"person": user.get_username(), "sessions": sessions})
    return password


def _end_sessions(user) -> int:
    """Deletes the unexpired sessions that sign `user` in (the database session store: each is decoded once)."""
    mine = [
        session.session_key
        for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator()
        if str(session.get_decoded().get("_auth_user_id")) == str(user.pk)
    ]
    Session.objects.filter(session_key__in=mine).delete()
    return len(mine)


def _revoke_tokens(user, by) -> int:
    if not apps.is_installed("taskhub.api"):
        return 0
    tokens = apps.get_model("api", "ApiToken").objects.filter(user=user, revoked_at__isnull=True)
    now = timezone.now()
    revoked = list(tokens.values_list("pk", "prefix"))
    tokens.update(revoked_at=now)
    for token_id, prefix in revoked:
        _record("api_token.revoked", by, {"token_id": token_id, "prefix": prefix, "for": user.get_username()})
    return len(revoked)


def groups_named(names) -> list[Group]:
    """The groups of these names (for the command); unknown names refused, nothing created."""
    names = sorted({name.strip() for name in names if name.strip()})
    found = list(Group.objects.filter(name__in=names))
    missing = sorted(set(names) - {group.name for group in found})
    if missing:
        known = ", ".join(Group.objects.order_by("name").values_list("name", flat=True)) or "none"
        raise PeopleRefused(f"No group named {', '.join(missing)}. Groups: {known}.")
    return found
