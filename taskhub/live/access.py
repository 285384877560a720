"""Who may receive what over the live socket, decided by taskhub.accounts.permissions.

A socket reads its user's access on connect, again when told the access may have changed (the signals
below publish `access.changed` after a commit that touches roles, memberships or servers' approver groups),
and at the latest ACCESS_MAX_AGE_SECONDS after its last read, in case such a message was lost (the channel
layer delivers at most once).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from importlib import import_module

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from taskhub.accounts import permissions
from taskhub.accounts.signals import session_roles_changed

ACCESS_MAX_AGE_SECONDS = 30.0


@dataclass(frozen=True)
class LiveAccess:
    """Also the audience of a change: sockets with equal access get the same shared fragments."""

    sees_all_tasks: bool
    approvable_server_ids: frozenset[int]
    roles: permissions.Roles = permissions.NO_ROLES

    def may_see_task(self, task) -> bool:
        return self.may_see_tasks_of(task.server_id)

    def may_see_tasks_of(self, server_id: int) -> bool:
        # The rule of permissions.may_see_task / tasks.queries.tasks_visible_to, from what was read once.
        return self.sees_all_tasks or server_id in self.approvable_server_ids


NO_ACCESS = LiveAccess(sees_all_tasks=False, approvable_server_ids=frozenset())


def access_for(user) -> LiveAccess:
    """What this user may see live. Inactive or anonymous users see nothing."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NO_ACCESS
    return LiveAccess(
        sees_all_tasks=permissions.sees_all_tasks(user),
        approvable_server_ids=frozenset(permissions.approvable_servers(user)),
        roles=permissions.roles_of(user),
    )


_rendering_for: ContextVar["LiveAccess | None"] = ContextVar("taskhub_live_access", default=None)


@contextmanager
def rendering_for(access: LiveAccess) -> Iterator[None]:
    """Fragments rendered inside are for sockets with this access (an audience), whatever the user's is now."""
    token = _rendering_for.set(access)
    try:
        with permissions.read_once():
            yield
    finally:
        _rendering_for.reset(token)


def access_in_force(user) -> LiveAccess:
    """For renderers: the access of the sockets being rendered for; outside a live rendering, the user's now.
    A fragment shared by an audience must follow the audience's access, not the one of the user it was
    rendered with (whose access may have changed before the sockets heard of it)."""
    return _rendering_for.get() or access_for(user)


def current_access(user_id: int) -> tuple[object | None, LiveAccess]:
    """The user, read again (None once deleted or deactivated), and their access now."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None, NO_ACCESS
    user = permissions.with_roles_read_once(user)
    return user, access_for(user)


def connected_access(user) -> LiveAccess:
    """The access of a socket's user at connect; its roles are kept on the user object, as current_access does."""
    return access_for(permissions.with_roles_read_once(user))


def session_expiry(session_key: str | None, user_id: int) -> datetime | None:
    """When the socket's session expires, or None once it no longer signs this user in: signed out (deleted),
    expired, or made with a password the user has since changed. The check django.contrib.auth.get_user makes
    for every HTTP request, without its side effects (it would cycle or flush the browser's session)."""
    if not session_key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    data = store.load()  # {} when the session is missing or expired
    if not _signs_in(data, user_id, lambda: get_user_model().objects.filter(pk=user_id, is_active=True).first()):
        return None
    model = getattr(store, "model", None)  # the database engines: the row's own expiry
    if model is not None:
        return model.objects.filter(session_key=session_key).values_list("expire_date", flat=True).first()
    return store.get_expiry_date()


def session_expiries(sessions: list[tuple[str | None, int]]) -> list[datetime | None]:
    """session_expiry of each (session key, user id), for the database session engine in two queries whatever their
    number: the sockets of a process hearing a change re-check their sessions together (every ACCESS_MAX_AGE_SECONDS),
    one query each was thousands at fan-out (bench/fanout.py)."""
    from django.contrib.sessions.backends.db import SessionStore as DatabaseStore

    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    if not issubclass(store_class, DatabaseStore):
        return [session_expiry(session_key, user_id) for session_key, user_id in sessions]
    keys = {session_key for session_key, _ in sessions if session_key}
    rows = {
        row.session_key: row
        for row in store_class.get_model_class().objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
    }
    users = get_user_model().objects.filter(pk__in={user_id for _, user_id in sessions}, is_active=True)
    users_by_id = {user.pk: user for user in users}
    expiries = []
    for session_key, user_id in sessions:
        row = rows.get(session_key)
        data = store_class().decode(row.session_data) if row is not None else {}
        signs_in = row is not None and _signs_in(data, user_id, lambda user_id=user_id: users_by_id.get(user_id))
        expiries.append(row.expire_date if signs_in else None)
    return expiries


def _signs_in(data: dict, user_id: int, active_user) -> bool:
    """Whether session data signs this user in: theirs, by a configured backend, with their current password."""
    if (
        str(data.get(SESSION_KEY)) != str(user_id)
        or data.get(BACKEND_SESSION_KEY) not in settings.AUTHENTICATION_BACKENDS
    ):
        return False
    user = active_user()
    session_hash = data.get(HASH_SESSION_KEY)
    if user is None or not session_hash:
        return False
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return any(constant_time_compare(session_hash, known) for known in hashes)


# --- telling sockets their access may have changed ----------------------------------------------------


def _after_commit(user_ids=None) -> None:
    """user_ids: those whose access changed; None: anyone's may have (servers, groups)."""
    from taskhub.live import publish

    ids = None if user_ids is None else sorted(user_ids)
    transaction.on_commit(lambda: publish.publish_access_changed(user_ids=ids))


def _user_saved(sender, instance, created, update_fields=None, **kwargs) -> None:
    if created or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return  # a new user has no socket; signing in changes nothing of the access
    _after_commit({instance.pk})


def _user_deleted(sender, instance, **kwargs) -> None:
    _after_commit({instance.pk})


def _memberships_changed(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    # user.groups.… names the user; group.user_set.… names users (or, cleared, nobody): tell everyone then.
    _after_commit({instance.pk} if not reverse else (pk_set or None))


def _signed_out(sender, request=None, user=None, **kwargs) -> None:
    """Sent before the session is deleted, so its sockets are told which session it was (and close at once)."""
    from taskhub.live import publish

    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if user is not None and session_key:
        publish.publish_session_ended(user_id=user.pk, session_key=session_key)


def _session_roles_changed(sender, user_id: int, session_key: str | None, **kwargs) -> None:
    """Its provider changed a session's roles (taskhub.accounts.sso): that session's sockets close, as on sign-out."""
    from taskhub.live import publish

    if session_key:
        publish.publish_session_ended(user_id=user_id, session_key=session_key)


def _anyones_access_changed(sender, action=None, created=True, **kwargs) -> None:
    if action is not None and action not in ("post_add", "post_remove", "post_clear"):
        return
    if not created:
        return  # a server renamed or re-pointed: who may approve for it is unchanged
    _after_commit(None)


# What a server's tools as agents see them depend on; a save naming none of these (a poll's reachability) says nothing.
CATALOGUE_FIELDS = frozenset({"name", "enabled", "tools", "capabilities", "discovered_at", "removed_at"})


def _catalogue_changed(sender, instance=None, update_fields=None, **kwargs) -> None:
    if update_fields is not None and not CATALOGUE_FIELDS & set(update_fields):
        return
    from taskhub.live import publish

    transaction.on_commit(publish.publish_catalogue_changed)


def connect_access_signals() -> None:
    """From LiveConfig.ready(): whoever changes roles or approver groups (pages, admin, CLI, shell)."""
    from django.apps import apps
    from django.contrib.auth.models import Group

    from taskhub.servers.models import Server

    user_model = get_user_model()
    uid = "taskhub.live.access."
    post_save.connect(_user_saved, sender=user_model, dispatch_uid=uid + "user_saved")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid=uid + "user_deleted")
    # A password change saves the user (above): the sockets read their access and check their session again.
    user_logged_out.connect(_signed_out, dispatch_uid=uid + "signed_out")
    session_roles_changed.connect(_session_roles_changed, dispatch_uid=uid + "session_roles_changed")
    m2m_changed.connect(_memberships_changed, sender=user_model.groups.through, dispatch_uid=uid + "memberships")
    # Approval policies (taskhub/approvals, beside this layer: named by label, never imported) decide who answers.
    if apps.is_installed("taskhub.approvals"):
        policy = apps.get_model("approvals", "ApprovalPolicy")
        post_save.connect(_anyones_access_changed, sender=policy, dispatch_uid=uid + "policy_saved")
        post_delete.connect(_anyones_access_changed, sender=policy, dispatch_uid=uid + "policy_deleted")
        for through in (policy.groups.through, policy.users.through):
            m2m_changed.connect(_anyones_access_changed, sender=through, dispatch_uid=uid + through.__name__)
    # Servers without a policy are answered by every approver; deleting a group drops its memberships.
    post_save.connect(_anyones_access_changed, sender=Server, dispatch_uid=uid + "server_saved")
    post_delete.connect(_anyones_access_changed, sender=Server, dispatch_uid=uid + "server_deleted")
    # The gateway's toolsListChanged listeners: a server enabled, disabled, discovered again or removed.
    post_save.connect(_catalogue_changed, sender=Server, dispatch_uid=uid + "catalogue_saved")
    post_delete.connect(_catalogue_changed, sender=Server, dispatch_uid=uid + "catalogue_deleted")
    post_delete.connect(_anyones_access_changed, sender=Group, dispatch_uid=uid + "group_deleted")
