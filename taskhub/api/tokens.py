"""API tokens: created and revoked with an audit row; looked up by the hash of what the client sends."""

import functools
import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from taskhub.accounts.groups import ROLE_GROUPS
from taskhub.accounts.permissions import role_group_names_sql, roles_from
from taskhub.api.models import ApiToken
from taskhub.audit.services import record_event
from taskhub.database.prepared import prepared_cursor
from taskhub.live import publish
from taskhub.tasks import raw_rows

TOKEN_PREFIX = "thk_"
SHOWN_CHARS = len(TOKEN_PREFIX) + 6
# Writing last_used_at on every request would turn each API read into a write; once a minute is enough.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def key_hash_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def create_token(*, user, name: str, created_by=None, expires_at=None) -> tuple[ApiToken, str]:
    """A new token for `user`; returns the row and the secret, which is never retrievable again. From
    `expires_at` on (None: never) the token is refused."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name.strip()[:100],
        prefix=secret[:SHOWN_CHARS],
        key_hash=key_hash_of(secret),
        expires_at=expires_at,
    )
    data = {"token_id": token.pk, "prefix": token.prefix, "name": token.name, "for": user.get_username()}
    if expires_at is not None:
        data["expires_at"] = expires_at.isoformat()
    record_event(action="api_token.created", user=created_by, data=data)
    return token, secret


@transaction.atomic
def revoke_token(*, token: ApiToken, revoked_by=None) -> ApiToken:
    token = ApiToken.objects.select_for_update(no_key=True).get(pk=token.pk)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        record_event(
            action="api_token.revoked",
            user=revoked_by,
            data={"token_id": token.pk, "prefix": token.prefix, "for": token.user.get_username()},
        )
        # Its open gateway streams read their access again and end (the sockets of its user's sessions stay).
        user_id = token.user_id
        transaction.on_commit(lambda: publish.publish_access_changed(user_ids=[user_id]))
    return token


def user_for_token(secret: str):
    """The active user a presented token acts as, or None (unknown, revoked, or the user is inactive)."""
    token = active_token(secret)
    return token.user if token is not None else None


def active_token(secret: str) -> ApiToken | None:
    """The presented token, with its user, if it may be used now; else None (unknown, revoked, expired, or the user is
    inactive). The token, not only its user, is what the services record as the agent of what it does."""
    if not secret or not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    with prepared_cursor() as cursor:
        cursor.execute(_token_with_user_and_roles_sql(), [list(ROLE_GROUPS), key_hash_of(secret)])
        row = cursor.fetchone()
    now = timezone.now()
    if row is None:
        return None
    token, user = raw_rows.instances(row[:-1], [ApiToken, get_user_model()])
    if token.expires_at is not None and token.expires_at <= now:
        return None
    raw_rows.relate(token, "user", user)
    # Read with the token, for the request it authenticates (as fresh as roles_of's once per request, and as the
    # session's user is read: accounts.backends): its role questions ask no query of their own.
    user.taskhub_roles = roles_from(user, set(row[-1]))
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


@functools.cache
def _token_with_user_and_roles_sql() -> str:
    """The token (every column), its user's, and the names of the user's role groups, in one statement (every agent's
    call asks it: through the ORM, the token with its user took about 1 ms of CPU and the roles a query more);
    parameters: the role group names, the key's hash. Only a token not revoked, of an active user."""
    user_model = get_user_model()
    selected = ", ".join(raw_rows.columns("t", ApiToken) + raw_rows.columns("u", user_model))
    return f"""
        SELECT {selected}, {role_group_names_sql("u")}
        FROM "{ApiToken._meta.db_table}" t JOIN "{user_model._meta.db_table}" u ON u.id = t.user_id
        WHERE t.key_hash = %s AND t.revoked_at IS NULL AND u.is_active
    """
