"""Connect in a browser (issue 33 item 1): the authorization code grant in two halves, for a web app whose person
leaves with one request and comes back with another, perhaps to another process.

The first half (:func:`start_authorization`) is the SDK's own flow (`mcp.client.auth`, through
:func:`taskhub.mcp.oauth.oauth_provider`) run up to the moment it would send a person away: an unauthorized request
to the server, its 401 challenge, protected resource metadata (RFC 9728), the authorization server's metadata (RFC
8414 / OpenID, issuer checked), the scopes the challenge or metadata name, and the client's identification in the
specification's order (a Client ID Metadata Document URL when the authorization server supports it, else dynamic
registration; a client an admin registered beforehand is found in the store). The registration and what discovery
found go to the store; the authorization URL (PKCE S256, `state`, `resource`, `scope`) and what the second half
needs (:class:`PendingAuthorization`: state, code verifier, the exact redirect URI) come back to the caller, who
keeps the latter where only that person's next request finds it (the web app: the session).

The second half (:func:`finish_authorization`) checks what the browser brought back (`state`, then the issuer of
RFC 9207) and exchanges the code at the token endpoint with the verifier, the same redirect URI and the `resource`
parameter, authenticating the client as its registration says. It stores nothing: the caller stores the tokens with
its own record of the connection.

No Django. Tokens, codes, verifiers and secrets never appear in a repr or a message from here.
"""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urljoin, urlparse

from mcp.client.auth import OAuthFlowError, OAuthRegistrationError, OAuthTokenError, PKCEParameters
from mcp.client.auth.oauth2 import OAuthContext
from mcp.client.auth.utils import union_scopes, validate_authorization_response_iss
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl, ValidationError

from taskhub.mcp.oauth import (
    AuthorizationCodeProvider,
    AuthorizationProblem,
    Discovery,
    KeptAuthorization,
    OAuthClientSettings,
    _echo,
    authorize_ahead,
    oauth_provider,
)
from taskhub.mcp.outbound import Outbound

TOKEN_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, kw_only=True)
class PendingAuthorization:
    """What the second half needs of the first: kept by the caller for this person only, used once."""

    state: str = field(repr=False)
    code_verifier: str = field(repr=False)
    redirect_uri: str
    resource: str
    scope: str | None
    protocol_version: str | None

    def stored(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "code_verifier": self.code_verifier,
            "redirect_uri": self.redirect_uri,
            "resource": self.resource,
            "scope": self.scope,
            "protocol_version": self.protocol_version,
        }

    @classmethod
    def from_stored(cls, stored: Any) -> PendingAuthorization | None:
        if not isinstance(stored, dict):
            return None
        try:
            return cls(**{name: stored[name] for name in cls.__dataclass_fields__})
        except (KeyError, TypeError):
            return None


@dataclass(frozen=True)
class BrowserLeg:
    """Where to send the person, and what to keep until they come back."""

    authorization_url: str
    pending: PendingAuthorization


class NeedsClient(AuthorizationProblem):
    """The authorization server neither reads a Client ID Metadata Document of ours nor registers clients
    dynamically: a person must register taskhub there and enter its client id (and secret)."""


class _SendTheBrowser(Exception):
    def __init__(self, leg: BrowserLeg) -> None:
        super().__init__("the person is sent to the authorization server")
        self.leg = leg


class _NotAnError(logging.Filter):
    """The SDK logs whatever ends its flow as an error ("OAuth flow error"); the first half's planned stop is none."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not isinstance(sys.exc_info()[1], _SendTheBrowser)


logging.getLogger("mcp.client.auth.oauth2").addFilter(_NotAnError())


class _FirstHalf(AuthorizationCodeProvider):
    """The SDK's flow up to the authorization request, which it hands back instead of waiting for a callback."""

    async def _perform_authorization(self):
        await self._keep_discovery()
        if self.extra_scope:  # a wider scope the server asked for since (step-up), beside the selection's
            metadata = self.context.client_metadata
            metadata.scope = union_scopes(metadata.scope, self.extra_scope)
        raise _SendTheBrowser(authorization_request(self.context))


def authorization_request(context: OAuthContext) -> BrowserLeg:
    """The authorization request the SDK's `_perform_authorization_code_grant` builds (mcp 2.3), with the state and
    verifier kept for the second half rather than in a local of a coroutine that waits for the callback."""
    client = context.client_info
    if client is None or not context.client_metadata.redirect_uris:
        raise AuthorizationProblem("no client registration to authorize with")
    metadata = context.oauth_metadata
    if metadata is not None and metadata.authorization_endpoint:
        endpoint = str(metadata.authorization_endpoint)
    else:
        endpoint = urljoin(context.get_authorization_base_url(context.server_url), "/authorize")
    pkce = PKCEParameters.generate()
    state = secrets.token_urlsafe(32)
    redirect_uri = str(context.client_metadata.redirect_uris[0])
    params = {
        "response_type": "code",
        "client_id": client.client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": pkce.code_challenge,
        "code_challenge_method": "S256",
    }
    if context.should_include_resource_param(context.protocol_version):
        params["resource"] = context.get_resource_url()  # RFC 8707
    scope = context.client_metadata.scope
    if scope:
        params["scope"] = scope
        if "offline_access" in scope.split():
            params["prompt"] = "consent"  # OpenID: offline access is asked with consent
    separator = "&" if urlparse(endpoint).query else "?"
    return BrowserLeg(
        authorization_url=f"{endpoint}{separator}{urlencode(params)}",
        pending=PendingAuthorization(
            state=state,
            code_verifier=pkce.code_verifier,
            redirect_uri=redirect_uri,
            resource=context.server_url,
            scope=scope,
            protocol_version=context.protocol_version,
        ),
    )


class _WithoutTokens:
    """The store as the first half sees it: no tokens (Connect authorizes anew even when some are kept; a stale
    one would only be refused), the registration and discovery as kept. The first half stores no token."""

    def __init__(self, storage: KeptAuthorization) -> None:
        self._storage = storage

    async def get_tokens(self) -> OAuthToken | None:
        return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        raise AuthorizationProblem("the first half of Connect stores no token")

    async def get_expires_at(self) -> float | None:
        return None

    async def get_discovery(self) -> Discovery | None:
        return await self._storage.get_discovery()

    async def set_discovery(self, discovery: Discovery) -> None:
        await self._storage.set_discovery(discovery)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return await self._storage.get_client_info()

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        await self._storage.set_client_info(client_info)


async def start_authorization(
    *,
    server_url: str,
    storage: KeptAuthorization,
    outbound: Outbound,
    redirect_uri: str,
    protocol_version: str,
    client_metadata_url: str | None = None,
    scope: str | None = None,
    probe_url: str | None = None,
) -> BrowserLeg | None:
    """Ask the server, unauthorized; on its challenge run discovery and the client's identification and return
    where to send the person (asking for `scope` too, besides the scopes the challenge or metadata name). None when
    the server answered without asking for authorization. NeedsClient when
    no way to identify taskhub is left but a client an admin registers; AuthorizationProblem otherwise.
    `probe_url`: where to ask, when it is not `server_url` itself (the server's URL with the secret query values it
    needs, which the resource the tokens are for leaves masked)."""
    settings = OAuthClientSettings(client_metadata_url=client_metadata_url, scope=scope or None)
    provider = oauth_provider(
        server_url=server_url,
        settings=settings,
        storage=_WithoutTokens(storage),
        redirect=_NoCallback(redirect_uri),
        code_provider=_FirstHalf,
    )
    try:
        await authorize_ahead(
            server_url=probe_url or server_url, auth=provider, outbound=outbound, protocol_version=protocol_version
        )
    except _SendTheBrowser as sent:
        return sent.leg
    except OAuthRegistrationError:
        raise NeedsClient(
            "the authorization server registers no clients by itself: register taskhub there and enter its client id"
        ) from None
    except Exception as error:
        if isinstance(error, AuthorizationProblem):
            raise
        raise AuthorizationProblem(provider.failure_message() or _describe(error)) from None
    return None


class _NoCallback:
    """The first half's redirect: the SDK never reaches it (_FirstHalf hands the request back first)."""

    def __init__(self, redirect_uri: str) -> None:
        self.redirect_uri = redirect_uri

    async def redirect_handler(self, authorization_url: str) -> None:
        raise AuthorizationProblem("the first half of Connect does not wait for a person")

    async def callback_handler(self):
        raise AuthorizationProblem("the first half of Connect does not wait for a person")


def _describe(error: BaseException) -> str:
    if isinstance(error, (OAuthFlowError, OAuthTokenError)):
        return _echo(f"{type(error).__name__}: {str(error).split(':', 1)[0]}")
    return f"the server or its authorization server could not be asked ({type(error).__name__})"


async def finish_authorization(
    *, pending: PendingAuthorization, answer: Mapping[str, str], storage: KeptAuthorization, outbound: Outbound
) -> OAuthToken:
    """The tokens for the code the browser brought back (`answer`: the callback's query), after checking its state
    and issuer. Reads the registration and discovery the first half stored; stores nothing.
    AuthorizationProblem, saying why, for anything refused."""
    if "error" in answer:
        described = answer.get("error_description")
        detail = f": {_echo(described)}" if described else ""
        raise AuthorizationProblem(f"the authorization server refused: {_echo(answer['error'])}{detail}")
    given_state = answer.get("state") or ""
    if not secrets.compare_digest(given_state.encode(), pending.state.encode()):
        raise AuthorizationProblem("the answer's state is not the one this Connect sent (refused)")
    discovery = await storage.get_discovery()
    client = await storage.get_client_info()
    if discovery is None or client is None:
        raise AuthorizationProblem("what Connect found out about the server is gone: connect again")
    try:
        validate_authorization_response_iss(answer.get("iss"), discovery.authorization_server)
    except OAuthFlowError:
        raise AuthorizationProblem(
            "the answer names another issuer (iss) than the authorization server this Connect went to (refused)"
        ) from None
    code = answer.get("code")
    if not code:
        raise AuthorizationProblem("the authorization server's answer carries no code")
    context = OAuthContext(
        server_url=pending.resource,
        client_metadata=OAuthClientMetadata(redirect_uris=[AnyUrl(pending.redirect_uri)], scope=pending.scope),
        storage=storage,
        redirect_handler=None,
        callback_handler=None,
        protected_resource_metadata=discovery.protected_resource,
        oauth_metadata=discovery.authorization_server,
        auth_server_url=discovery.authorization_server_url,
        client_info=client,
    )
    metadata = discovery.authorization_server
    if metadata is not None and metadata.token_endpoint:
        token_url = str(metadata.token_endpoint)
    else:
        token_url = urljoin(context.get_authorization_base_url(pending.resource), "/token")
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": pending.redirect_uri,
        "client_id": client.client_id,
        "code_verifier": pending.code_verifier,
    }
    if context.should_include_resource_param(pending.protocol_version):
        data["resource"] = context.get_resource_url()  # RFC 8707
    try:
        data, headers = context.prepare_token_auth(data, {"Content-Type": "application/x-www-form-urlencoded"})
        async with outbound.httpx_client(timeout=TOKEN_TIMEOUT_SECONDS, follow_redirects=False) as http:
            response = await http.post(token_url, data=data, headers=headers)
            await response.aread()
    except OAuthTokenError as error:
        raise AuthorizationProblem(_describe(error)) from None
    except Exception as error:
        raise AuthorizationProblem(
            f"the authorization server's token endpoint could not be reached ({type(error).__name__})"
        ) from None
    if response.status_code not in (200, 201):
        refused = _token_error(response)
        raise AuthorizationProblem(f"the token endpoint refused the code: HTTP {response.status_code}{refused}")
    try:
        tokens = OAuthToken.model_validate_json(response.content)
    except ValidationError:
        # Not quoted: a token response that failed validation may hold the token.
        raise AuthorizationProblem("the token endpoint's answer is not a token response") from None
    if tokens.scope is None:
        tokens.scope = pending.scope  # RFC 6749 §5.1: what was asked for was granted
    return tokens


def _token_error(response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return f" {_echo(error)}" if isinstance(error, str) else ""
