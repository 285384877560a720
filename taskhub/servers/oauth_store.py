"""The web app's and the workers' OAuth store: taskhub.mcp.oauth's KeptAuthorization on the encrypted
ServerAuthorization row of one server (issue 33 item 2).

The store is bound to one server and one resource: a row written for another resource (the server's URL changed
since it was authorized) reads as empty rather than its tokens being sent elsewhere. Nothing here logs or shows a
token; the row's repr names the server only.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import psycopg
from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthToken,
)
from mcp.shared.auth_utils import calculate_token_expiry
from pydantic import ValidationError

from taskhub.database.params import database_params
from taskhub.mcp import sdk_private
from taskhub.mcp.oauth import (
    AuthorizationProblem,
    ClientSecretProvider,
    Discovery,
    OAuthClientSettings,
    OAuthProvider,
    PrivateKeyProvider,
    jwt_assertion_provider,
    oauth_provider,
)
from taskhub.servers import signals
from taskhub.servers.models import Server, ServerAuthorization

# The first key of the advisory locks taken around a server's token refresh (the second is the server's id).
REFRESH_LOCK_CLASS = 0x0A17


class DatabaseTokenStore:
    """KeptAuthorization (and so the SDK's TokenStorage) on one server's ServerAuthorization row.

    Each read goes to the database, so a token another process stored (a refresh won elsewhere) is the one used."""

    def __init__(self, *, server_id: int, resource: str) -> None:
        self.server_id = server_id
        self.resource = resource

    def __repr__(self) -> str:
        return f"DatabaseTokenStore(server_id={self.server_id})"

    @contextlib.asynccontextmanager
    async def refresh_lock(self) -> AsyncIterator[None]:
        """Held by one process at a time per server (taskhub.mcp.oauth.SharedRefresh): a session advisory lock on a
        connection of its own, so it is held across the refresh request without a transaction open in Django's."""
        async with await psycopg.AsyncConnection.connect(**database_params(), autocommit=True) as locking:
            await locking.execute("SELECT pg_advisory_lock(%s, %s)", (REFRESH_LOCK_CLASS, self.server_id))
            try:
                yield
            finally:
                await locking.execute("SELECT pg_advisory_unlock(%s, %s)", (REFRESH_LOCK_CLASS, self.server_id))

    # --- sync halves (also for services and views) -------------------------------------------------------------

    def row(self) -> ServerAuthorization | None:
        row = ServerAuthorization.objects.filter(server_id=self.server_id).first()
        if row is None or row.resource != self.resource:
            return None
        return row

    def _update(self, **fields: Any) -> None:
        row = self.row()
        if row is None:
            # A new authorization for this resource: whatever was kept for another one is dropped, not reused.
            ServerAuthorization.objects.update_or_create(
                server_id=self.server_id,
                defaults={
                    "resource": self.resource,
                    "client_info": {},
                    "discovery": {},
                    "tokens": {},
                    "expires_at": None,
                    **fields,
                },
            )
            return
        for name, value in fields.items():
            setattr(row, name, value)
        row.save(update_fields=[*fields, "updated_at"])

    def tokens_now(self) -> OAuthToken | None:
        row = self.row()
        if row is None or not row.tokens:
            return None
        try:
            return OAuthToken.model_validate(row.tokens)
        except ValidationError:
            return None

    def store_tokens(self, tokens: OAuthToken) -> None:
        expires_at = calculate_token_expiry(tokens.expires_in) if tokens.expires_in is not None else None
        with transaction.atomic():
            self._update(
                tokens=tokens.model_dump(mode="json", exclude_none=True),
                expires_at=expires_at,
                needs_reauthorization_since=None,
                wanted_scope="",
            )
            Server.objects.filter(pk=self.server_id, oauth=False).update(oauth=True)

    def keep_client_without_tokens(
        self, client_info: OAuthClientInformationFull, *, private_key: dict[str, str] | None = None
    ) -> None:
        """A new client for the server, and no tokens of the old one (nor its mark). `private_key`: {"pem",
        "algorithm"} of a client that authenticates with a JWT client assertion; none is kept otherwise."""
        self._update(
            client_info=client_info.model_dump(mode="json", exclude_none=True),
            client_key=private_key or {},
            tokens={},
            expires_at=None,
            needs_reauthorization_since=None,
            wanted_scope="",
        )

    def mark_needs_reauthorization(self, *, wanted_scope: str = "") -> None:
        """Mark the server (once: the mark's first setting is announced, for the admins' mail). `wanted_scope`: a
        wider scope the server asked for (a 403 insufficient_scope), which the admin's next Connect asks for."""
        with transaction.atomic():
            if wanted_scope:
                ServerAuthorization.objects.filter(server_id=self.server_id).update(wanted_scope=wanted_scope[:2000])
            marked = ServerAuthorization.objects.filter(
                server_id=self.server_id, needs_reauthorization_since__isnull=True
            ).update(needs_reauthorization_since=timezone.now())
            server = Server.objects.filter(pk=self.server_id, oauth=True).only("pk", "name").first()
            if marked and server is not None:
                transaction.on_commit(
                    lambda: signals.needs_reauthorization.send_robust(
                        sender=Server, server_id=server.pk, server_name=server.name
                    )
                )

    def client_info_now(self) -> OAuthClientInformationFull | None:
        row = self.row()
        if row is None or not row.client_info:
            return None
        try:
            return OAuthClientInformationFull.model_validate(row.client_info)
        except ValidationError:
            return None

    # --- KeptAuthorization --------------------------------------------------------------------------------------

    async def get_tokens(self) -> OAuthToken | None:
        return await sync_to_async(self.tokens_now)()

    async def set_tokens(self, tokens: OAuthToken) -> None:
        await sync_to_async(self.store_tokens)(tokens)

    async def get_expires_at(self) -> float | None:
        row = await sync_to_async(self.row)()
        return row.expires_at if row is not None and row.tokens else None

    async def get_discovery(self) -> Discovery | None:
        row = await sync_to_async(self.row)()
        # An empty row's {} is no discovery (the file store's {} would be one with nothing found).
        return Discovery.from_stored(row.discovery) if row is not None and row.discovery else None

    async def set_discovery(self, discovery: Discovery) -> None:
        await sync_to_async(self._update)(discovery=discovery.stored())

    def private_key_now(self) -> dict[str, str]:
        row = self.row()
        return dict(row.client_key) if row is not None and isinstance(row.client_key, dict) else {}

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return await sync_to_async(self.client_info_now)()

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        await sync_to_async(self._update)(client_info=client_info.model_dump(mode="json", exclude_none=True))


class NoPersonHere:
    """The redirect of a worker's or the web process's requests: nobody is there to authorize, so a flow that needs
    a person (the refresh failed: revoked, expired) marks the server as needing re-authorization and fails."""

    redirect_uri = "http://127.0.0.1/oauth/callback"

    def __init__(self, store: DatabaseTokenStore) -> None:
        self.store = store

    async def redirect_handler(self, authorization_url: str) -> None:
        # The scope the flow would have asked for: after a 403 insufficient_scope, the SDK's union of the granted
        # and the challenged scopes (step-up). Kept when it is wider than what was granted: the admin's next Connect
        # asks for it.
        asked = parse_qs(urlsplit(authorization_url).query).get("scope", [""])[0]
        await sync_to_async(self._mark)(asked)

    def _mark(self, asked: str) -> None:
        granted = self.store.tokens_now()
        wider = set(asked.split()) - set(((granted.scope if granted else None) or "").split())
        self.store.mark_needs_reauthorization(wanted_scope=asked if wider else "")
        raise AuthorizationProblem("the server needs an admin to connect it again (its token could not be refreshed)")

    async def callback_handler(self) -> AuthorizationCodeResult:
        raise AuthorizationProblem("the server needs an admin to connect it again")


class _KeptClient:
    """The client-credentials grant with the client kept (encrypted) in the server's store rather than given to the
    constructor: no query when the provider is made (Server.to_target runs in async code too)."""

    async def _initialize(self) -> None:
        await sdk_private.initialize_provider(_KeptClient, self)
        kept = await self.context.storage.get_client_info()  # type: ignore[attr-defined]
        if kept is None:
            raise AuthorizationProblem("no client is kept for this server's client credentials")
        self.context.client_info = kept  # type: ignore[attr-defined]

    async def _handle_token_response(self, response: httpx2.Response) -> None:
        """A token request the authorization server refuses (a secret or key revoked or rotated there, a client
        removed) marks the server as needing an admin, as a failed refresh does: its launches and answers wait for
        the admin to enter the client again instead of failing (issue 33 item 3). A server error (5xx) marks
        nothing."""
        if 400 <= response.status_code < 500:
            store = self.context.storage  # type: ignore[attr-defined]
            await sync_to_async(store.mark_needs_reauthorization)()
            raise AuthorizationProblem(
                f"the authorization server refused this server's client credentials (HTTP {response.status_code}):"
                " an admin must enter the client again"
            )
        await sdk_private.handle_token_response(_KeptClient, self, response)


class StoredClientCredentials(_KeptClient, ClientSecretProvider):
    """With the kept client id and secret."""


class StoredPrivateKeyCredentials(_KeptClient, PrivateKeyProvider):
    """With the kept client id and private key: each token request carries a JWT client assertion (RFC 7523) signed
    with it, for the authorization server's issuer."""

    def __init__(self, *, server_url: str, storage: DatabaseTokenStore) -> None:
        async def assertion(audience: str) -> str:
            key = await sync_to_async(storage.private_key_now)()
            client = self.context.client_info
            if not key.get("pem") or client is None:
                raise AuthorizationProblem("no private key is kept for this server's client credentials")
            sign = jwt_assertion_provider(
                client_id=client.client_id, private_key_pem=key["pem"], algorithm=key.get("algorithm") or "RS256"
            )
            return await sign(audience)

        super().__init__(server_url=server_url, storage=storage, client_id="(kept)", assertion_provider=assertion)


def stored_authorization(
    *, server_id: int, resource: str, client_credentials: bool = False, private_key: bool = False
) -> OAuthProvider:
    """The httpx2.Auth for a server connected through OAuth: its kept registration and tokens, refreshed one
    process at a time; a person is never asked (NoPersonHere). With `client_credentials`, taskhub gets and renews
    the tokens itself with the kept client id and secret, or with its private key (`private_key`; issue 33 item 5)."""
    store = DatabaseTokenStore(server_id=server_id, resource=resource)
    if client_credentials:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no issuer named: the one discovery finds, as the SDK allows until 3.0
            if private_key:
                return StoredPrivateKeyCredentials(server_url=resource, storage=store)
            return StoredClientCredentials(
                server_url=resource, storage=store, client_id="(kept)", client_secret="(kept)"
            )
    return oauth_provider(
        server_url=resource, settings=OAuthClientSettings(), storage=store, redirect=NoPersonHere(store)
    )
