"""Authorization to MCP servers behind OAuth: the client side of the MCP authorization specification.

The `mcp` SDK's OAuth client (`mcp.client.auth`) does the protocol: on a 401 it reads the `WWW-Authenticate`
challenge, finds the protected resource metadata (RFC 9728) and the authorization server's metadata (RFC 8414 / OpenID
discovery, the issuer checked), identifies the client in the specification's order (a Client ID Metadata Document URL
when the authorization server supports it, else dynamic registration, RFC 7591), runs the authorization code grant
with PKCE S256, the `resource` parameter (RFC 8707), the scopes the challenge or metadata name, checks `state` and the
authorization response's `iss` (RFC 9207), refreshes tokens, steps up on a 403 `insufficient_scope`, and does the
client-credentials grant (client secret basic/post, private-key JWT). It is an `httpx2.Auth`: every request it makes
(metadata, registration, token) is sent by the httpx2 client it is attached to, which taskhub builds with
:class:`~taskhub.mcp.outbound.Outbound`, so the address policy judges authorization servers too.

taskhub owns the rest, here, for the command line today and the web Connect flow and worker refresh next:

- :class:`OAuthClientSettings`: who the client is (pre-registered id and secret, a CIMD URL, client credentials with
  a secret or a private key), what scope and issuer;
- :func:`oauth_provider`: the SDK provider for those settings, with a limit on authorizations per run and the first
  failure kept (:class:`AuthorizationProblem`) so callers can say what went wrong;
- where the code comes back (:class:`LoopbackRedirect` for a person, RFC 8252; :class:`UnattendedRedirect` where the
  authorization server approves without one);
- where tokens, their expiry, the client's registration and what discovery found are kept
  (:class:`KeptAuthorization`: the SDK's :class:`~mcp.client.auth.TokenStorage` and the expiry and
  :class:`Discovery`, so a later process refreshes by itself; :class:`MemoryTokenStore`, :class:`FileTokenStore`; the
  web app's encrypted store implements the same protocol). A store is bound to one resource: tokens are only ever sent
  to the server they were issued for;
- :func:`authorize_ahead`: authorize before a session opens (a person takes longer than a request may).

Tokens and secrets never appear in a repr, a message or a log line from here. No Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import os
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qs, urlsplit

import httpx2
from mcp.client.auth import OAuthClientProvider, OAuthRegistrationError, OAuthTokenError, TokenStorage
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
)
from mcp.client.auth.utils import extract_field_from_www_auth, union_scopes
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.auth_utils import calculate_token_expiry
from pydantic import AnyUrl, ValidationError

from taskhub.mcp import sdk_private
from taskhub.mcp.errors import AuthorizationProblem
from taskhub.mcp.excerpts import validation_summary
from taskhub.mcp.outbound import Outbound

# More authorizations than this in one provider's life is a loop (a server that keeps asking for a scope it never
# grants): the conformance suite's scope-retry-limit allows 3.
MAX_AUTHORIZATIONS = 3
REDIRECT_PATH = "/callback"
TOKEN_FILE_LIMIT = 1_000_000
# What of the authorization server's redirect or error we repeat to a person.
ECHO_CAP = 200
CLIENT_AUTH_METHODS = ("client_secret_basic", "client_secret_post", "none")


class _NoTracebacks(logging.Filter):
    """The SDK logs each failed flow with its traceback, and a token or registration response that failed validation
    is quoted in it (pydantic's `input_value=…`): the token, the client secret. The record keeps its message; the
    caller still gets the exception (and :meth:`_Guarded.failure_message` says it without quoting)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        return True


def _quiet_sdk_tracebacks() -> None:
    sdk_logger = logging.getLogger("mcp.client.auth.oauth2")
    if not any(isinstance(existing, _NoTracebacks) for existing in sdk_logger.filters):
        sdk_logger.addFilter(_NoTracebacks())


_quiet_sdk_tracebacks()


# --- who the client is ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OAuthClientSettings:
    """How taskhub identifies itself to a server's authorization server. Secrets stay out of repr().

    - nothing set: a Client ID Metadata Document URL (`client_metadata_url`) when the authorization server supports
      it, else dynamic registration;
    - `client_id` (and `client_secret`): a client registered beforehand, authenticated at the token endpoint by
      `client_auth` (default: client_secret_basic with a secret, none without);
    - `client_credentials`: the client-credentials grant, no person: `client_id` with `client_secret` or
      `private_key_pem` (private-key JWT, RFC 7523, signed with `signing_algorithm`, default inferred from the key).
    `issuer`: the authorization server the credentials belong to; they are sent nowhere else.
    """

    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    client_auth: str | None = None
    client_metadata_url: str | None = None
    client_credentials: bool = False
    private_key_pem: str | None = field(default=None, repr=False)
    signing_algorithm: str | None = None
    scope: str | None = None
    issuer: str | None = None
    client_name: str = "taskhub"

    def problems(self) -> list[str]:
        """What is wrong with these settings, in a person's words (empty when they can be used)."""
        found = []
        if self.client_auth is not None and self.client_auth not in CLIENT_AUTH_METHODS:
            found.append(f"the client authentication must be one of {', '.join(CLIENT_AUTH_METHODS)}")
        if self.client_auth in ("client_secret_basic", "client_secret_post") and not self.client_secret:
            found.append(f"{self.client_auth} needs a client secret")
        if (self.client_secret or self.client_auth) and not self.client_id:
            found.append("a client secret or client authentication needs a client id")
        if self.client_credentials:
            if not self.client_id:
                found.append("the client-credentials grant needs a client id")
            if bool(self.client_secret) == bool(self.private_key_pem):
                found.append("the client-credentials grant needs a client secret or a private key (one of them)")
            if self.client_auth == "none":
                found.append("the client-credentials grant cannot use client authentication 'none'")
        elif self.private_key_pem:
            found.append("a private key is used by the client-credentials grant only")
        if self.client_metadata_url is not None and not _is_cimd_url(self.client_metadata_url):
            found.append("a client metadata document URL must be https with a path")
        for name, url in (("issuer", self.issuer),):
            if url is not None and urlsplit(url).scheme not in ("http", "https"):
                found.append(f"the {name} must be an http(s) URL")
        return found


def _is_cimd_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme == "https" and bool(parts.netloc) and parts.path not in ("", "/")


def signing_algorithm_of(private_key_pem: str) -> str:
    """The JWS algorithm for a PEM private key: ES256/ES384/ES512 by an EC key's curve, RS256 for RSA, EdDSA for
    Ed25519. AuthorizationProblem when the key cannot be read."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    try:
        key = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
    except (ValueError, TypeError) as error:
        raise AuthorizationProblem(f"the private key is not an unencrypted PEM private key ({error})") from None
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        by_curve = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
        if key.curve.name in by_curve:
            return by_curve[key.curve.name]
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "EdDSA"
    raise AuthorizationProblem("the private key's type is not one a JWT client assertion can be signed with")


def jwt_assertion_provider(*, client_id: str, private_key_pem: str, algorithm: str, lifetime_s: int = 300):
    """An SDK assertion provider: a client assertion (RFC 7523 §2.2) for the authorization server's issuer."""
    import jwt  # PyJWT: only a private-key client loads it

    async def assertion(audience: str) -> str:
        now = int(time.time())
        claims = {
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "iat": now,
            "exp": now + lifetime_s,
            "jti": str(uuid.uuid4()),
        }
        return jwt.encode(claims, private_key_pem, algorithm=algorithm)

    return assertion


# --- where the authorization code comes back ----------------------------------------------------------------------


class Redirect(Protocol):
    """Where the authorization server sends the person (or the unattended request) back with the code."""

    redirect_uri: str

    async def redirect_handler(self, authorization_url: str) -> None: ...

    async def callback_handler(self) -> AuthorizationCodeResult: ...


def _code_result(query: str) -> AuthorizationCodeResult:
    """The code, state and iss of a redirect's query; AuthorizationProblem for an error or no code."""
    params = {name: values[0] for name, values in parse_qs(query, keep_blank_values=True).items() if values}
    if "error" in params:
        described = params.get("error_description")
        detail = f": {_echo(described)}" if described else ""
        raise AuthorizationProblem(f"the authorization server refused: {_echo(params['error'])}{detail}")
    if not params.get("code"):
        raise AuthorizationProblem("the authorization server's redirect carries no code")
    return AuthorizationCodeResult(code=params["code"], state=params.get("state"), iss=params.get("iss"))


def _echo(text: str) -> str:
    """Untrusted text from an authorization server, safe in one line of a message."""
    cleaned = "".join(char for char in text if char.isprintable())
    return cleaned[:ECHO_CAP] + ("…" if len(cleaned) > ECHO_CAP else "")


class UnattendedRedirect:
    """For an authorization server that approves without a person (the conformance suite's, a test's): follows the
    authorization URL with one GET through `outbound` and reads the code from its redirect's Location."""

    def __init__(self, *, outbound: Outbound, redirect_uri: str = f"http://127.0.0.1{REDIRECT_PATH}", timeout=10.0):
        self.redirect_uri = redirect_uri
        self._outbound = outbound
        self._timeout = timeout
        self._result: AuthorizationCodeResult | None = None

    async def redirect_handler(self, authorization_url: str) -> None:
        self._result = None
        async with self._outbound.httpx_client(timeout=self._timeout, follow_redirects=False) as client:
            response = await client.get(authorization_url)
        location = response.headers.get("location")
        if not response.is_redirect or not location:
            raise AuthorizationProblem(
                f"the authorization endpoint answered HTTP {response.status_code} without a redirect: it needs a "
                "person (authorize in a browser instead)"
            )
        target = urlsplit(location)
        expected = urlsplit(self.redirect_uri)
        if (target.scheme, target.netloc, target.path) != (expected.scheme, expected.netloc, expected.path):
            raise AuthorizationProblem("the authorization endpoint redirected somewhere other than the redirect URI")
        self._result = _code_result(target.query)

    async def callback_handler(self) -> AuthorizationCodeResult:
        if self._result is None:
            raise AuthorizationProblem("no authorization code came back")
        result, self._result = self._result, None
        return result


_PAGE = (
    "<!doctype html><meta charset=utf-8><title>taskhub</title>"
    "<p>{message}</p><p>You may close this window and return to the terminal.</p>"
)


class LoopbackRedirect:
    """For a person (RFC 8252 §7.3): listens on 127.0.0.1 (any free port, or `port`), says which URL to open, and
    waits for the browser's redirect to http://127.0.0.1:PORT/callback. Only that path is answered; the first
    request carrying a code or an error ends the wait. Use as an async context manager (it owns the socket)."""

    def __init__(self, *, port: int = 0, announce, timeout: float = 300.0) -> None:
        self._port = port
        self._announce = announce  # called with the authorization URL (the CLI prints it)
        self._timeout = timeout
        self._server: asyncio.Server | None = None
        self._arrived: asyncio.Future[str] | None = None
        self.redirect_uri = ""

    async def __aenter__(self) -> LoopbackRedirect:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._port)
        port = self._server.sockets[0].getsockname()[1]
        self.redirect_uri = f"http://127.0.0.1:{port}{REDIRECT_PATH}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def redirect_handler(self, authorization_url: str) -> None:
        self._arrived = asyncio.get_running_loop().create_future()
        self._announce(authorization_url)

    async def callback_handler(self) -> AuthorizationCodeResult:
        if self._arrived is None:
            raise AuthorizationProblem("no authorization was started")
        try:
            query = await asyncio.wait_for(self._arrived, self._timeout)
        except TimeoutError:
            raise AuthorizationProblem(f"no redirect came back within {self._timeout:g}s") from None
        return _code_result(query)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            method, _, rest = request_line.decode("latin-1").partition(" ")
            target = urlsplit(rest.rsplit(" ", 1)[0])
            waiting = self._arrived is not None and not self._arrived.done()
            if method != "GET" or target.path != REDIRECT_PATH or not waiting:
                await _respond(writer, 404, "Nothing here.")
                return
            assert self._arrived is not None
            self._arrived.set_result(target.query)
            await _respond(writer, 200, "taskhub received the authorization server's answer.")
        except (TimeoutError, OSError, UnicodeError, ValueError):
            pass
        finally:
            writer.close()


async def _respond(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = _PAGE.format(message=html.escape(message)).encode()
    reason = "OK" if status == 200 else "Not Found"
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()


async def authorize_ahead(*, server_url: str, auth: httpx2.Auth, outbound: Outbound, protocol_version: str) -> None:
    """Authorize before an MCP session opens, where a person may take minutes to approve and the session's requests
    have timeouts: one `server/discover` request (harmless, the first thing a client sends anyway) through `auth`,
    which authorizes if the server demands it. Its answer is not read beyond the status; the session that follows
    finds the token in `auth`. Exceptions as `auth` and httpx2 raise them."""
    body = {"jsonrpc": "2.0", "id": "taskhub-authorize", "method": "server/discover", "params": {}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": protocol_version,
        "Mcp-Method": "server/discover",
    }
    async with (
        outbound.httpx_client(auth=auth, timeout=30.0, follow_redirects=False) as client,
        client.stream("POST", server_url, json=body, headers=headers) as response,
    ):
        await response.aclose()


# --- where tokens are kept ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Discovery:
    """What discovery found: kept beside the tokens, so that a later process refreshes at the authorization server's
    own token endpoint (and with the `resource` parameter) without a request refused first."""

    protected_resource: ProtectedResourceMetadata | None
    authorization_server: OAuthMetadata | None
    authorization_server_url: str | None

    def stored(self) -> dict[str, Any]:
        """As JSON, for a token store (a file's, the web app's database row)."""

        def dumped(model: Any) -> Any:
            return model.model_dump(mode="json", exclude_none=True) if model is not None else None

        return {
            "protected_resource": dumped(self.protected_resource),
            "authorization_server": dumped(self.authorization_server),
            "authorization_server_url": self.authorization_server_url,
        }

    @classmethod
    def from_stored(cls, stored: Any) -> Discovery | None:
        """What stored() wrote; None for anything else (a store edited by hand, an older format)."""
        if not isinstance(stored, dict):
            return None
        try:
            resource = stored.get("protected_resource")
            server = stored.get("authorization_server")
            server_url = stored.get("authorization_server_url")
            return cls(
                protected_resource=ProtectedResourceMetadata.model_validate(resource) if resource else None,
                authorization_server=OAuthMetadata.model_validate(server) if server else None,
                authorization_server_url=server_url if isinstance(server_url, str) else None,
            )
        except ValidationError:
            return None


@runtime_checkable
class KeptAuthorization(TokenStorage, Protocol):
    """A TokenStorage that also keeps when the access token expires and what discovery found (the SDK's protocol
    keeps neither: a token loaded from storage would count as valid until refused, then a person asked again)."""

    async def get_expires_at(self) -> float | None: ...

    async def get_discovery(self) -> Discovery | None: ...

    async def set_discovery(self, discovery: Discovery) -> None: ...


@runtime_checkable
class SharedRefresh(KeptAuthorization, Protocol):
    """A store several processes use at once: `refresh_lock()` is held by one of them at a time (the web app's is a
    Postgres advisory lock per server)."""

    def refresh_lock(self) -> contextlib.AbstractAsyncContextManager[None]: ...


class MemoryTokenStore(TokenStorage):
    """Tokens and the client's registration for this process only."""

    def __init__(self) -> None:
        self._tokens: OAuthToken | None = None
        self._expires_at: float | None = None
        self._client: OAuthClientInformationFull | None = None
        self._discovery: Discovery | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self._tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._tokens = tokens
        self._expires_at = calculate_token_expiry(tokens.expires_in) if tokens.expires_in is not None else None

    async def get_expires_at(self) -> float | None:
        return self._expires_at

    async def get_discovery(self) -> Discovery | None:
        return self._discovery

    async def set_discovery(self, discovery: Discovery) -> None:
        self._discovery = discovery

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self._client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._client = client_info

    def __repr__(self) -> str:
        return "MemoryTokenStore()"


class FileTokenStore(TokenStorage):
    """Tokens and the client's registration in a JSON file only its owner may read (0600, replaced atomically),
    bound to one resource: a file written for another server is refused rather than its tokens sent there."""

    def __init__(self, path: Path, *, resource: str) -> None:
        self.path = path
        self.resource = resource
        self._document: dict[str, Any] | None = None

    def load(self) -> None:
        """Read the file now (a missing file is an empty store); AuthorizationProblem when it cannot be used."""
        try:
            with self.path.open("rb") as file:
                raw = file.read(TOKEN_FILE_LIMIT + 1)
        except FileNotFoundError:
            self._document = {"resource": self.resource}
            return
        except OSError as error:
            raise AuthorizationProblem(f"cannot read the token file: {error.strerror}") from None
        try:
            if len(raw) > TOKEN_FILE_LIMIT:
                raise ValueError("too large")
            document = json.loads(raw)
            if not isinstance(document, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeError):
            raise AuthorizationProblem(f"the token file {self.path} is not one taskhub wrote") from None
        if document.get("resource") != self.resource:
            raise AuthorizationProblem(
                f"the token file {self.path} holds tokens for another server; use another file for this one"
            )
        self._document = document

    def _loaded(self) -> dict[str, Any]:
        if self._document is None:
            self.load()
        assert self._document is not None
        return self._document

    async def get_tokens(self) -> OAuthToken | None:
        try:
            stored = self._loaded().get("tokens")
            return OAuthToken.model_validate(stored) if stored else None
        except ValidationError:
            return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        document = self._loaded()
        document["tokens"] = tokens.model_dump(mode="json", exclude_none=True)
        expires_in = tokens.expires_in
        document["expires_at"] = calculate_token_expiry(expires_in) if expires_in is not None else None
        self._write()

    async def get_expires_at(self) -> float | None:
        expires_at = self._loaded().get("expires_at")
        return float(expires_at) if isinstance(expires_at, int | float) else None

    async def get_discovery(self) -> Discovery | None:
        return Discovery.from_stored(self._loaded().get("discovery"))

    async def set_discovery(self, discovery: Discovery) -> None:
        self._loaded()["discovery"] = discovery.stored()
        self._write()

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        try:
            stored = self._loaded().get("client")
            return OAuthClientInformationFull.model_validate(stored) if stored else None
        except ValidationError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._loaded()["client"] = client_info.model_dump(mode="json", exclude_none=True)
        self._write()

    def _write(self) -> None:
        text = json.dumps(self._loaded(), indent=1)
        directory = self.path.parent
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            os.fchmod(descriptor, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def __repr__(self) -> str:
        return f"FileTokenStore({str(self.path)!r})"


# --- the provider -------------------------------------------------------------------------------------------------


# A kept token is refreshed this long before it expires (at most; a fifth of its lifetime for a short one), so that
# a request never leaves with a token that expires on the way.
REFRESH_AHEAD_SECONDS = 60.0


def _refresh_at(expires_at: float | None, tokens: OAuthToken | None) -> float | None:
    """When a kept token is due for refresh: REFRESH_AHEAD_SECONDS (or a fifth of its lifetime) before it expires."""
    if expires_at is None:
        return None
    lifetime = tokens.expires_in if tokens is not None and tokens.expires_in else None
    ahead = REFRESH_AHEAD_SECONDS if lifetime is None else min(REFRESH_AHEAD_SECONDS, max(lifetime, 0) / 5)
    return expires_at - ahead


class _Guarded:
    """Mixed into each SDK provider: at most MAX_AUTHORIZATIONS authorizations, the first failure kept, and the
    server's last refusal after authorizing (a 401 or 403 the flow handed back) remembered until a request succeeds."""

    failure: Exception | None = None
    authorizations: int = 0
    refusal: str | None = None
    # Scopes asked for beside those the specification's selection picks (the challenge's, else the metadata's),
    # which replaces the client's own on every challenge.
    extra_scope: str | None = None
    context: Any

    _kept_discovery: Discovery | None = None

    async def _initialize(self) -> None:
        await sdk_private.initialize_provider(_Guarded, self)
        storage = self.context.storage
        if not isinstance(storage, KeptAuthorization):
            return
        if self.context.current_tokens is not None:
            expires_at = await storage.get_expires_at()
            shared = isinstance(storage, SharedRefresh)  # the workers' store refreshes ahead of time
            self.context.token_expiry_time = (
                _refresh_at(expires_at, self.context.current_tokens) if shared else expires_at
            )
        discovery = await storage.get_discovery()
        if discovery is not None and self.context.oauth_metadata is None:
            self.context.protected_resource_metadata = discovery.protected_resource
            self.context.oauth_metadata = discovery.authorization_server
            self.context.auth_server_url = discovery.authorization_server_url
            self._kept_discovery = discovery

    async def _keep_discovery(self) -> None:
        storage = self.context.storage
        if not isinstance(storage, KeptAuthorization) or self.context.oauth_metadata is None:
            return
        discovery = Discovery(
            protected_resource=self.context.protected_resource_metadata,
            authorization_server=self.context.oauth_metadata,
            authorization_server_url=self.context.auth_server_url,
        )
        if discovery != self._kept_discovery:
            await storage.set_discovery(discovery)
            self._kept_discovery = discovery

    async def _perform_authorization(self) -> httpx2.Request:
        self.authorizations += 1
        if self.authorizations > MAX_AUTHORIZATIONS:
            raise AuthorizationProblem(
                f"the server still refuses after {MAX_AUTHORIZATIONS} authorizations (a scope it never grants?)"
            )
        if self.extra_scope:
            metadata = self.context.client_metadata
            metadata.scope = union_scopes(metadata.scope, self.extra_scope)
        return await sdk_private.perform_authorization(_Guarded, self)

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        # A store shared by several processes (SharedRefresh) refreshes one at a time: when the kept token has
        # expired, take the store's lock and read the tokens again, so that the loser of a race uses the winner's
        # token instead of refreshing it again (a rotated refresh token would be spent twice). The lock is held
        # until the request itself goes out (after the refresh, if one was needed), never while it runs.
        held = await self._take_refresh_lock()
        flow = super().async_auth_flow(request)  # type: ignore[misc]
        response: httpx2.Response | None = None
        retried = False
        try:
            outgoing = await flow.__anext__()
            while True:
                if held is not None and outgoing is request:
                    await held.__aexit__(None, None, None)
                    held = None
                response = yield outgoing
                if outgoing is request and not retried and self._refreshes_after(request, response):
                    # A kept token refused before its time (revoked, the server restarted): refresh it, one process
                    # at a time, and send the request once more, by running the SDK's flow again with the token
                    # counted as expired. Refused again, the SDK's own 401 handling follows (it asks for a person).
                    retried = True
                    await flow.aclose()
                    held = await self._lock_for_refresh_after_refusal(request)
                    flow = super().async_auth_flow(request)  # type: ignore[misc]
                    outgoing = await flow.__anext__()
                    continue
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            if response is not None and response.request is request:
                self._note_outcome(response)
            await self._keep_discovery()
            return
        except Exception as error:
            if self.failure is None:
                self.failure = error
            if isinstance(error, AuthorizationProblem) and error.method is None:
                error.method = _jsonrpc_method(request)  # which request went unauthorized (errors.AuthorizationProblem)
            raise
        finally:
            if held is not None:
                await held.__aexit__(None, None, None)
            await flow.aclose()

    async def _take_refresh_lock(self) -> contextlib.AbstractAsyncContextManager[None] | None:
        storage = self.context.storage
        if not isinstance(storage, SharedRefresh):
            return None
        kept = await storage.get_tokens()
        refresh_at = _refresh_at(await storage.get_expires_at(), kept)
        if refresh_at is None or time.time() < refresh_at:
            if kept is not None and sdk_private.provider_initialized(self):
                # What the store holds goes out: another process may have refreshed (and rotated) the token this
                # provider read before, whose refresh token is spent.
                self.context.current_tokens = kept
                self.context.token_expiry_time = refresh_at
            return None
        held = storage.refresh_lock()
        await held.__aenter__()
        try:
            # What the winner stored (or, still due, what this process refreshes under the lock).
            tokens = self.context.current_tokens = await storage.get_tokens()
            self.context.token_expiry_time = _refresh_at(await storage.get_expires_at(), tokens)
        except BaseException:
            await held.__aexit__(None, None, None)
            raise
        return held

    def _refreshes_after(self, request: httpx2.Request, response: httpx2.Response) -> bool:
        """Whether a refusal of `request` is answered by a refresh first: a 401 to a request that carried a kept
        token, from a store several processes share (the workers' and the web app's, where nobody is there to
        authorize), with a refresh token to refresh with."""
        if response.status_code != 401 or not isinstance(self.context.storage, SharedRefresh):
            return False
        tokens = self.context.current_tokens
        sent = request.headers.get("authorization", "")
        return sent.startswith("Bearer ") and tokens is not None and bool(tokens.refresh_token)

    async def _lock_for_refresh_after_refusal(self, request: httpx2.Request) -> contextlib.AbstractAsyncContextManager:
        """The refresh lock, with the kept tokens read again under it: a token another process stored since the
        refused one was sent is used as it is; the refused one counts as expired, so the flow refreshes it."""
        storage = self.context.storage
        assert isinstance(storage, SharedRefresh)
        held = storage.refresh_lock()
        await held.__aenter__()
        try:
            tokens = self.context.current_tokens = await storage.get_tokens()
            if tokens is not None and request.headers.get("authorization") == f"Bearer {tokens.access_token}":
                self.context.token_expiry_time = 1.0  # long past (0 would read as "never expires")
            else:
                self.context.token_expiry_time = _refresh_at(await storage.get_expires_at(), tokens)
        except BaseException:
            await held.__aexit__(None, None, None)
            raise
        return held

    def _note_outcome(self, response: httpx2.Response) -> None:
        if response.is_success:
            self.refusal = None
        elif response.status_code in (401, 403) and self.authorizations:
            error = extract_field_from_www_auth(response, "error")
            scope = extract_field_from_www_auth(response, "scope")
            detail = f" {_echo(error)}" if error else ""
            detail += f" (scope {_echo(scope)})" if scope else ""
            self.refusal = f"the server refused the authorization it granted: HTTP {response.status_code}{detail}"

    def failure_message(self) -> str | None:
        """What went wrong with authorization, in one line without secrets (None when nothing did)."""
        error = self.failure
        if error is None:
            return self.refusal
        if isinstance(error, AuthorizationProblem):
            return str(error)
        if isinstance(error, httpx2.HTTPError):
            return f"the authorization server could not be reached ({type(error).__name__})"
        if isinstance(error, (OAuthTokenError, OAuthRegistrationError)):
            # After its colon the SDK quotes the authorization server's answer: a token response that failed
            # validation quotes the token, a registration response the client secret.
            return f"{type(error).__name__}: {_echo(str(error).split(':', 1)[0])}"
        if isinstance(error, ValidationError):
            return validation_summary(error)
        # The SDK's other messages name URLs, statuses and issuers.
        return _echo(f"{type(error).__name__}: {error}")


class AuthorizationCodeProvider(_Guarded, OAuthClientProvider):
    """The SDK's authorization-code provider; a pre-registered client is used as stored when nothing is."""

    def __init__(self, *, preregistered: OAuthClientInformationFull | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._preregistered = preregistered

    async def _initialize(self) -> None:
        await sdk_private.initialize_provider(AuthorizationCodeProvider, self)
        if self.context.client_info is None and self._preregistered is not None:
            self.context.client_info = self._preregistered


class ClientSecretProvider(_Guarded, ClientCredentialsOAuthProvider):
    """Client credentials with a client secret (basic or post)."""


class PrivateKeyProvider(_Guarded, PrivateKeyJWTOAuthProvider):
    """Client credentials with a private-key JWT client assertion."""


OAuthProvider = AuthorizationCodeProvider | ClientSecretProvider | PrivateKeyProvider


def oauth_provider(
    *,
    server_url: str,
    settings: OAuthClientSettings,
    storage: TokenStorage,
    redirect: Redirect | None,
    code_provider: type[AuthorizationCodeProvider] = AuthorizationCodeProvider,
) -> OAuthProvider:
    """The `httpx2.Auth` that authorizes requests to `server_url` as `settings` say. Attach it to an httpx2 client
    made by :class:`~taskhub.mcp.outbound.Outbound`. `redirect` is needed by the authorization code grant only;
    `code_provider` is the class that runs that grant (the web app's Connect splits it in two: oauth_browser).
    AuthorizationProblem when the settings cannot be used."""
    provider = _provider(
        server_url=server_url, settings=settings, storage=storage, redirect=redirect, code_provider=code_provider
    )
    provider.extra_scope = settings.scope
    return provider


def _provider(
    *,
    server_url: str,
    settings: OAuthClientSettings,
    storage: TokenStorage,
    redirect: Redirect | None,
    code_provider: type[AuthorizationCodeProvider],
) -> OAuthProvider:
    if problems := settings.problems():
        raise AuthorizationProblem("; ".join(problems))
    if settings.client_credentials:
        assert settings.client_id is not None
        with warnings.catch_warnings():
            # The SDK warns when no issuer is named; the flow then uses the one discovery finds, as the spec allows.
            warnings.simplefilter("ignore")
            if settings.private_key_pem:
                algorithm = settings.signing_algorithm or signing_algorithm_of(settings.private_key_pem)
                return PrivateKeyProvider(
                    server_url=server_url,
                    storage=storage,
                    client_id=settings.client_id,
                    assertion_provider=jwt_assertion_provider(
                        client_id=settings.client_id, private_key_pem=settings.private_key_pem, algorithm=algorithm
                    ),
                    scope=settings.scope,
                    issuer=settings.issuer,
                )
            assert settings.client_secret is not None
            return ClientSecretProvider(
                server_url=server_url,
                storage=storage,
                client_id=settings.client_id,
                client_secret=settings.client_secret,
                token_endpoint_auth_method=settings.client_auth or "client_secret_basic",  # type: ignore[arg-type]
                scope=settings.scope,
                issuer=settings.issuer,
            )
    if redirect is None:
        raise AuthorizationProblem("the authorization code grant needs a redirect (a person or unattended)")
    redirect_uris = [AnyUrl(redirect.redirect_uri)]
    preregistered = None
    if settings.client_id is not None:
        method = settings.client_auth or ("client_secret_basic" if settings.client_secret else "none")
        preregistered = OAuthClientInformationFull(
            client_id=settings.client_id,
            client_secret=settings.client_secret,
            redirect_uris=redirect_uris,
            token_endpoint_auth_method=method,
            issuer=settings.issuer,
        )
    return code_provider(
        server_url=server_url,
        client_metadata=OAuthClientMetadata(
            client_name=settings.client_name,
            redirect_uris=redirect_uris,
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            scope=settings.scope,
        ),
        storage=storage,
        redirect_handler=redirect.redirect_handler,
        callback_handler=redirect.callback_handler,
        client_metadata_url=settings.client_metadata_url,
        preregistered=preregistered,
    )


def _jsonrpc_method(request: httpx2.Request) -> str:
    """The JSON-RPC method a request to an MCP server carries: its `Mcp-Method` header (2026-07-28), else its body's
    `method` ("" for a response or a body that cannot be read)."""
    if method := request.headers.get("mcp-method"):
        return method
    try:
        body = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError, TypeError):
        return ""
    return body.get("method", "") if isinstance(body, dict) and isinstance(body.get("method"), str) else ""
