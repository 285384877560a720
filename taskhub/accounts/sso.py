"""Single sign-on through an OpenID Connect provider (issue 35, item 1), on mozilla-django-oidc.

Configured by environment variables (settings.py, TASKHUB_OIDC_*): the issuer, whose endpoints are discovered from its
/.well-known/openid-configuration (read once per process, on the first sign-in), the client id and secret, the scopes,
the claim that carries the person's groups and the map from the provider's groups to taskhub's role groups.

A person signing in through the provider is found by the username claim (created on first sign-in, without a
password; an account that has a password is local and never signed in through the provider) and their role groups set
to what the provider's groups map to; their other groups (approver groups an admin gave them) stay. The
session keeps the access token; `recheck_roles` (middleware) asks the provider's userinfo again at most every
TASKHUB_OIDC_RECHECK_SECONDS, at the person's next request, and follows their groups: a role lost is gone from that
request on, and the sockets of that session close as a sign-out closes them (the open page says it is not live; once
reloaded it follows the roles left). An expired access token is refreshed first; a sign-in the provider no longer
accepts (refresh refused: revoked, the person disabled) signs them out.

Changing memberships with user.groups (never a direct table write) tells their live sockets (taskhub.live.access).
"""

import json
import logging
import time
import urllib.error
import urllib.request
from functools import cache

import requests
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import Group
from django.db import transaction
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.utils.decorators import sync_and_async_middleware
from mozilla_django_oidc import auth as oidc_auth
from mozilla_django_oidc import views as oidc_views

from taskhub.accounts import signals
from taskhub.accounts.groups import ROLE_GROUPS
from taskhub.audit.services import record_event

logger = logging.getLogger(__name__)

SESSION_ISSUER = "taskhub_sso_issuer"  # the session was signed in through this issuer
SESSION_CHECKED_AT = "taskhub_sso_checked_at"  # time.time() of the last userinfo read
ACCESS_TOKEN = "oidc_access_token"  # mozilla-django-oidc's key (OIDC_STORE_ACCESS_TOKEN)
REFRESH_TOKEN = "taskhub_sso_refresh_token"  # a new access token when the provider's expire (Keycloak: 5 minutes)
BACKEND = "taskhub.accounts.sso.SsoBackend"

_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


def enabled() -> bool:
    return bool(settings.TASKHUB_OIDC_ISSUER)


@cache
def discovery() -> dict:
    """The issuer's OpenID Provider metadata (OpenID Connect Discovery 1.0), checked to name the same issuer."""
    issuer = settings.TASKHUB_OIDC_ISSUER.rstrip("/")
    with urllib.request.urlopen(f"{issuer}/.well-known/openid-configuration", timeout=10) as response:
        metadata = json.loads(response.read(1_000_000))
    if str(metadata.get("issuer", "")).rstrip("/") != issuer:
        raise ValueError(f"The provider at {issuer} names another issuer: {metadata.get('issuer')!r}")
    return metadata


def oidc_setting(attr, *args):
    """mozilla-django-oidc's settings, the provider's endpoints from discovery (unless set explicitly)."""
    if attr in _ENDPOINTS and not getattr(settings, attr, None):
        return discovery()[_ENDPOINTS[attr]]
    return oidc_auth.import_from_settings(attr, *args)


def role_groups_for(claims: dict) -> set[str]:
    """The taskhub role groups the provider's groups (the groups claim) map to."""
    groups = claims.get(settings.TASKHUB_OIDC_GROUPS_CLAIM) or []
    if isinstance(groups, str):
        groups = [groups]
    mapping = settings.TASKHUB_OIDC_GROUP_ROLES
    return {
        role for group in groups if isinstance(group, str) for role in mapping.get(group, ()) if role in ROLE_GROUPS
    }


@transaction.atomic
def follow_provider_groups(*, user, claims: dict) -> tuple[list[str], list[str]]:
    """`user`'s role groups set to what the provider's groups map to (other groups kept); returns (before, after)."""
    wanted = role_groups_for(claims)
    before = sorted(user.groups.filter(name__in=ROLE_GROUPS).values_list("name", flat=True))
    removed, added = set(before) - wanted, wanted - set(before)
    if removed:
        user.groups.remove(*Group.objects.filter(name__in=removed))
    if added:
        user.groups.add(*Group.objects.filter(name__in=added))
    after = sorted(wanted)
    if before != after:
        record_event(
            action="person.groups_changed",
            actor_label=f"OIDC {settings.TASKHUB_OIDC_ISSUER}",
            data={"person": user.get_username(), "from": before, "to": after, "by": "identity provider groups"},
        )
    return before, after


class SsoBackend(oidc_auth.OIDCAuthenticationBackend):
    """Finds (or creates) the person by the username claim and gives them the roles their groups map to."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args, **kwargs):
        if not enabled():  # listed in AUTHENTICATION_BACKENDS only when configured; a stale session's backend
            self.UserModel = auth.get_user_model()
            return
        super().__init__(*args, **kwargs)

    def authenticate(self, request, **kwargs):
        if not enabled():
            return None
        return super().authenticate(request, **kwargs)

    def get_token(self, payload):
        token_info = super().get_token(payload)
        self._refresh_token = token_info.get("refresh_token")
        return token_info

    def store_tokens(self, access_token, id_token):
        super().store_tokens(access_token, id_token)
        if getattr(self, "_refresh_token", None):
            self.request.session[REFRESH_TOKEN] = self._refresh_token

    def _username(self, claims) -> str:
        return str(claims.get(settings.TASKHUB_OIDC_USERNAME_CLAIM) or "")[:150]

    def verify_claims(self, claims) -> bool:
        return bool(self._username(claims))

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(username=self._username(claims))

    def create_user(self, claims):
        user = self.UserModel.objects.create_user(
            username=self._username(claims), email=str(claims.get("email") or "")[:254]
        )
        user.set_unusable_password()  # signs in through the provider only
        user.save(update_fields=["password"])
        return self.update_user(user, claims)

    def update_user(self, user, claims):
        if not user.is_active:
            return None  # deactivated in taskhub: the provider does not bring them back
        if user.has_usable_password():
            # A local account (a break-glass admin, the demo's): whoever the provider names so does not take it over.
            logger.warning(
                "Single sign-on refused for %r: a local account with a password has that name", user.username
            )
            return None
        follow_provider_groups(user=user, claims=claims)
        self.request.session[SESSION_ISSUER] = settings.TASKHUB_OIDC_ISSUER
        self.request.session[SESSION_CHECKED_AT] = time.time()
        return user

    def get_user(self, user_id):
        from taskhub.accounts.backends import RateLimitedModelBackend

        return RateLimitedModelBackend().get_user(user_id)  # with the roles read in the same statement


class SsoRequestView(oidc_views.OIDCAuthenticationRequestView):
    get_settings = staticmethod(oidc_setting)
    provider_unreachable = False

    def __init__(self, *args, **kwargs):
        if not enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            super().__init__(*args, **kwargs)  # discovery, the first time
        except (OSError, ValueError, KeyError):
            logger.warning("The identity provider's discovery could not be read", exc_info=True)
            self.provider_unreachable = True

    def get(self, request):
        if self.provider_unreachable:
            return HttpResponseRedirect(reverse("accounts:login") + "?sso=failed")
        return super().get(request)


class SsoCallbackView(oidc_views.OIDCAuthenticationCallbackView):
    get_settings = staticmethod(oidc_setting)

    def get(self, request):
        if not enabled():
            raise Http404("Single sign-on is not configured.")
        return super().get(request)

    def login_success(self):
        response = super().login_success()
        record_sign_in(user=self.user, how={"method": "oidc", "issuer": settings.TASKHUB_OIDC_ISSUER})
        return response

    @property
    def failure_url(self):
        return reverse("accounts:login") + "?sso=failed"


def _userinfo(access_token: str) -> dict | None:
    """The provider's userinfo for this token; None when the provider refuses it (401/403)."""
    request = urllib.request.Request(
        oidc_setting("OIDC_OP_USER_ENDPOINT"), headers={"Authorization": f"Bearer {access_token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read(1_000_000))
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            return None
        raise


def _refreshed(session) -> str | None:
    """A new access token from the session's refresh token (kept, with the refresh token it may rotate), or None."""
    refresh_token = session.get(REFRESH_TOKEN)
    if not refresh_token:
        return None
    response = requests.post(
        oidc_setting("OIDC_OP_TOKEN_ENDPOINT"),
        data={
            "grant_type": "refresh_token",
            "refresh_token": refresh_token,
            "client_id": settings.OIDC_RP_CLIENT_ID,
            "client_secret": settings.OIDC_RP_CLIENT_SECRET,
        },
        timeout=settings.OIDC_TIMEOUT,
    )
    if response.status_code in (400, 401):  # invalid_grant: the sign-in ended at the provider
        return None
    response.raise_for_status()
    tokens = response.json()
    session[ACCESS_TOKEN] = tokens["access_token"]
    session[REFRESH_TOKEN] = tokens.get("refresh_token") or refresh_token
    return tokens["access_token"]


def recheck(request) -> None:
    """At most every TASKHUB_OIDC_RECHECK_SECONDS: the person's groups from userinfo again (see the module doc)."""
    session = request.session
    if not enabled() or session.get(SESSION_ISSUER) != settings.TASKHUB_OIDC_ISSUER:
        return
    if time.time() - session.get(SESSION_CHECKED_AT, 0) < settings.TASKHUB_OIDC_RECHECK_SECONDS:
        return
    user = request.user
    if not user.is_authenticated:
        return
    try:
        claims = _userinfo(session.get(ACCESS_TOKEN, ""))
        if claims is None and (access_token := _refreshed(session)):
            claims = _userinfo(access_token)
    except (OSError, ValueError, KeyError, requests.RequestException):
        logger.warning("The identity provider's userinfo could not be read; roles checked again at the next request")
        return
    if claims is None:
        auth.logout(request)  # the provider no longer knows this sign-in; logout closes the session's sockets
        return
    session[SESSION_CHECKED_AT] = time.time()
    before, after = follow_provider_groups(user=user, claims=claims)
    if before != after:
        session_key = session.session_key
        transaction.on_commit(
            lambda: signals.session_roles_changed.send(sender=None, user_id=user.pk, session_key=session_key)
        )
        # This request already follows the new roles.
        request.user = auth.get_user(request)


@sync_and_async_middleware
def recheck_roles(get_response):
    """Middleware, after AuthenticationMiddleware (in MIDDLEWARE only with a provider configured): recheck() before
    the view. Pages run the sync chain; in the async one (the gateway) a request without a session cookie (an API
    token's) costs nothing."""
    if iscoroutinefunction(get_response):

        async def async_middleware(request):
            if settings.SESSION_COOKIE_NAME in request.COOKIES:
                await sync_to_async(recheck)(request)
            return await get_response(request)

        return async_middleware

    def middleware(request):
        recheck(request)
        return get_response(request)

    return middleware


def record_sign_in(*, user, how: dict) -> None:
    """The audit row of a sign-in through a page (the sign-in form, or the provider's callback): how it was done."""
    with transaction.atomic():
        record_event(action="person.signed_in", user=user, data={"person": user.get_username(), **how})
