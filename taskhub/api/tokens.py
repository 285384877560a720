"""API tokens: created and revoked with an audit row; looked up by the hash of what the client sends."""

import hashlib
import secrets
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from taskhub.api.models import ApiToken
from taskhub.audit.services import record_event
from taskhub.live import publish

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
    try:
        # get(), not first(): a unique key needs no ORDER BY (the model's ordering), and every agent's call asks this.
        token = ApiToken.objects.select_related("user").get(
            key_hash=key_hash_of(secret), revoked_at__isnull=True, user__is_active=True
        )
    except ApiToken.DoesNotExist:
        token = None
    now = timezone.now()
    if token is None or (token.expires_at is not None and token.expires_at <= now):
        return None
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
