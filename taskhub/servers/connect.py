"""Connecting a server through OAuth in the admin's browser (issue 33 item 1): the two halves of
taskhub.mcp.oauth_browser on the server's encrypted store, and the one write that records a connection.

- :func:`start` asks the server and returns where the admin's browser goes (the registration and discovery are kept
  on the server's ServerAuthorization row, encrypted; what the callback needs is the caller's to keep: the session);
- :func:`finish` checks the answer the browser brought back and gets the tokens;
- :func:`record_connection`: the tokens stored, `server.connected` audited (no token in it) and the server's tools
  discovered again, in one transaction;
- :func:`record_authorization_needed`: a server that answered with an OAuth challenge says so on its page;
- :func:`enter_client`: the client id and secret an admin registered at an authorization server that neither reads
  taskhub's Client ID Metadata Document nor registers clients itself.
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl

from taskhub.audit.services import record_event
from taskhub.mcp import wire
from taskhub.mcp.oauth import AuthorizationProblem, OAuthClientSettings, signing_algorithm_of
from taskhub.mcp.oauth_browser import BrowserLeg, PendingAuthorization, finish_authorization, start_authorization
from taskhub.mcp.outbound import Outbound
from taskhub.mcp.secret_urls import with_secrets
from taskhub.servers import services
from taskhub.servers.models import Server, ServerAuthorization, Transport
from taskhub.servers.oauth_store import DatabaseTokenStore
from taskhub.servers.policy import server_address_policy

CLIENT_NAME = "taskhub"


def public_url(path: str) -> str | None:
    """`path` on taskhub's public https address (TASKHUB_BASE_URL), None when taskhub has none: an authorization
    server fetches a Client ID Metadata Document from there, so it must be https and reachable."""
    base = settings.TASKHUB_BASE_URL
    return f"{base}{path}" if base.startswith("https://") else None


def callback_url(request) -> str:
    """The one redirect URI of taskhub: on its public address when it has one (the Client ID Metadata Document
    names it there), else on the address this admin reached."""
    path = reverse("servers:oauth_callback")
    return public_url(path) or request.build_absolute_uri(path)


def client_metadata_document() -> dict:
    """What taskhub's Client ID Metadata Document says (its URL is its client_id)."""
    callback = public_url(reverse("servers:oauth_callback"))
    return {
        "client_id": public_url(reverse("servers:oauth_client_metadata")),
        "client_name": CLIENT_NAME,
        "redirect_uris": [callback] if callback else [],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }


def store_of(server: Server) -> DatabaseTokenStore:
    return DatabaseTokenStore(server_id=server.pk, resource=server.url)


def _outbound() -> Outbound:
    return Outbound(server_address_policy())


def start(*, server: Server, redirect_uri: str) -> BrowserLeg | None:
    """The first half, for a server's Connect button. None: the server asked for no authorization.
    AuthorizationProblem (NeedsClient among them) when it cannot start."""
    return async_to_sync(start_authorization)(
        server_url=server.url,
        storage=store_of(server),
        outbound=_outbound(),
        redirect_uri=redirect_uri,
        protocol_version=wire.PROTOCOL_VERSION,
        client_metadata_url=public_url(reverse("servers:oauth_client_metadata")),
        scope=wanted_scope(server),
        probe_url=with_secrets(server.url, dict(server.url_secrets or {})),  # as every request to it is sent
    )


def wanted_scope(server: Server) -> str:
    """The wider scope the server asked for since it was connected (a 403 insufficient_scope), or ""."""
    row = store_of(server).row()
    return row.wanted_scope if row is not None else ""


def finish(*, server: Server, pending: PendingAuthorization, answer: dict[str, str]) -> OAuthToken:
    """The second half: the tokens, or AuthorizationProblem saying why the answer was refused. Writes nothing."""
    return async_to_sync(finish_authorization)(
        pending=pending, answer=answer, storage=store_of(server), outbound=_outbound()
    )


@transaction.atomic
def record_connection(*, server: Server, tokens: OAuthToken, user) -> Server:
    """The admin connected the server: its tokens kept (encrypted), the mark of a needed authorization cleared,
    the connection audited without any token, and its tools discovered again in the background."""
    server = Server.objects.select_for_update(no_key=True).get(pk=server.pk)
    store = store_of(server)
    store.store_tokens(tokens)
    Server.objects.filter(pk=server.pk, oauth_client_credentials=True).update(
        oauth_client_credentials=False, oauth_client_private_key=False
    )
    ServerAuthorization.objects.filter(server_id=server.pk).exclude(client_key={}).update(client_key={})
    row = store.row()
    issuer = None
    if row is not None and isinstance(row.discovery, dict):
        issuer = row.discovery.get("authorization_server_url")
    record_event(
        action="server.connected",
        user=user,
        server=server,
        data={"name": server.name, "authorization_server": issuer, "scope": tokens.scope},
    )
    return services.request_discovery(server=server, user=user)


def record_authorization_needed(*, server: Server) -> None:
    """The server answered 401 with a Bearer challenge: its page says it needs authorization and offers Connect.
    Kept on its authorization row (for its URL); a connected server's mark is its refresh's (oauth_store)."""
    if server.transport != Transport.HTTP:
        return
    store = store_of(server)
    with transaction.atomic():
        if store.row() is None:
            ServerAuthorization.objects.update_or_create(
                server_id=server.pk,
                defaults={
                    "resource": server.url,
                    "client_info": {},
                    "discovery": {},
                    "tokens": {},
                    "expires_at": None,
                    "needs_reauthorization_since": timezone.now(),
                },
            )
        else:
            store.mark_needs_reauthorization()


def enter_client(*, server: Server, client_id: str, client_secret: str, redirect_uri: str) -> None:
    """Keep the client an admin registered at the server's authorization server (encrypted, like the tokens)."""
    problems = OAuthClientSettings(client_id=client_id, client_secret=client_secret or None).problems()
    if problems:
        raise ValueError("; ".join(problems))
    client = OAuthClientInformationFull(
        client_id=client_id,
        client_secret=client_secret or None,
        redirect_uris=[AnyUrl(redirect_uri)],
        token_endpoint_auth_method="client_secret_basic" if client_secret else "none",
    )
    async_to_sync(store_of(server).set_client_info)(client)


def authorization_state(server: Server) -> tuple[str | None, object]:
    """(what the page says of the server's OAuth, since when): "needs_authorization" (it challenged, never
    connected), "needs_reauthorization" (its token could not be refreshed), "connected", or None."""
    if server.transport != Transport.HTTP:
        return None, None
    row = ServerAuthorization.objects.filter(server=server, resource=server.url).first()
    if row is None:
        return None, None
    if row.needs_reauthorization_since is not None:
        state = "needs_reauthorization" if server.oauth and row.tokens else "needs_authorization"
        return state, row.needs_reauthorization_since
    return ("connected", row.updated_at) if server.oauth and row.tokens else (None, None)


@transaction.atomic
def set_client_credentials(
    *, server: Server, client_id: str, client_secret: str, user, private_key_pem: str = "", jwt_algorithm: str = ""
) -> Server:
    """A server whose tokens taskhub gets and renews itself, with the client credentials grant and the client an admin
    registered at its authorization server: its id and a secret, or its id and a private key whose JWT client
    assertions (RFC 7523) authenticate it (`jwt_algorithm`: the key's own by default). Kept encrypted, like the
    tokens; issue 33 item 5. The first request to it gets the first token; its tools are discovered now."""
    problems = OAuthClientSettings(
        client_id=client_id,
        client_secret=client_secret or None,
        private_key_pem=private_key_pem or None,
        client_credentials=True,
    ).problems()
    if problems:
        raise ValueError("; ".join(problems))
    private_key = None
    if private_key_pem:
        try:
            algorithm = signing_algorithm_of(private_key_pem)
        except AuthorizationProblem as problem:
            raise ValueError(str(problem)) from None
        if jwt_algorithm and jwt_algorithm != algorithm and not _fits(jwt_algorithm, algorithm):
            raise ValueError(f"a {algorithm} key cannot sign {jwt_algorithm} assertions")
        private_key = {"pem": private_key_pem, "algorithm": jwt_algorithm or algorithm}
    server = Server.objects.select_for_update(no_key=True).get(pk=server.pk)
    store = store_of(server)
    store.keep_client_without_tokens(
        OAuthClientInformationFull(
            client_id=client_id,
            client_secret=client_secret or None,
            redirect_uris=None,
            grant_types=["client_credentials"],
            token_endpoint_auth_method="private_key_jwt" if private_key else "client_secret_basic",
        ),
        private_key=private_key,
    )
    Server.objects.filter(pk=server.pk).update(
        oauth=True, oauth_client_credentials=True, oauth_client_private_key=private_key is not None
    )
    grant = {"grant": "client_credentials", "client_auth": "private_key_jwt" if private_key else "client_secret"}
    record_event(
        action="server.connected",
        user=user,
        server=server,
        data={"name": server.name, **grant, "client_id": client_id},
    )
    return services.request_discovery(server=server, user=user)


# The JWS algorithms a key of each kind may sign with (the key's own is the default).
KEY_ALGORITHMS = {"RS256": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")}


def _fits(wanted: str, keys_own: str) -> bool:
    return wanted in KEY_ALGORITHMS.get(keys_own, (keys_own,))
