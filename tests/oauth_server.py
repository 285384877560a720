"""A real OAuth authorization server for tests: the MCP SDK's server-side auth routes (mcp.server.auth) on a small
provider that approves every request, rotates refresh tokens, counts the refresh requests that reach it and can
revoke or expire tokens on command, and names itself in each redirect (`iss`, RFC 9207); beside it a protected
resource that accepts only the access tokens it issued (401 with WWW-Authenticate otherwise), and, given an
upstream MCP server (the demo server), that server behind the same tokens at /mcp (a streaming proxy: a real MCP
server protected by a real authorization server). Served by uvicorn in a thread (tests/threaded_app.py)."""

from __future__ import annotations

import base64
import contextlib
import hmac
import secrets
import threading
import time
from collections.abc import Iterator
from urllib.parse import parse_qs, unquote, urlencode

import aiohttp
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    RegistrationError,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl, AnyUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.threaded_app import ThreadedApp


class ApprovingProvider:
    """OAuthAuthorizationServerProvider that approves everything and keeps its state in memory."""

    def __init__(self) -> None:
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.refresh_requests = 0
        self.client_credentials_requests = 0
        # {client id: its public key, PEM}: clients that authenticate with a private-key JWT (RFC 7523) instead.
        self.client_keys: dict[str, str] = {}
        self.refuse_registration = False
        self.issuer = ""  # set once the port is known: what `iss` says in each redirect
        # Access tokens live this long (a test makes them short to see them refreshed).
        self.access_expires_in = 3600
        self._lock = threading.Lock()

    # --- commands for tests ---

    def issue(self, *, client_id: str, access_expires_in: int = 3600) -> OAuthToken:
        """Tokens as if a person had just authorized (for tests that start from an authorized server)."""
        return self._tokens(client_id=client_id, scopes=[], resource=None, expires_in=access_expires_in)

    def revoke_all(self) -> None:
        self.access.clear()
        self.refresh.clear()

    # --- the provider protocol ---

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    def registered(
        self, *, client_id: str, client_secret: str, redirect_uri: str, scope: str | None = None
    ) -> OAuthClientInformationFull:
        """A client registered by hand (as an admin does where registration is refused), authenticated by
        client_secret_basic, allowed `scope`."""
        return OAuthClientInformationFull(
            client_id=client_id,
            client_secret=client_secret,
            redirect_uris=[AnyUrl(redirect_uri)],
            token_endpoint_auth_method="client_secret_basic",
            grant_types=["authorization_code", "refresh_token"],
            scope=scope,
        )

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        if self.refuse_registration:
            raise RegistrationError(error="invalid_client_metadata", error_description="register by hand here")
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(16)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id or "",
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        separator = "&" if "?" in str(params.redirect_uri) else "?"
        answer = {"code": code, **({"state": params.state} if params.state else {}), "iss": self.issuer}
        return f"{params.redirect_uri}{separator}{urlencode(answer)}"

    async def load_authorization_code(self, client, authorization_code: str) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(self, client, authorization_code: AuthorizationCode) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        return self._tokens(
            client_id=client.client_id,
            scopes=authorization_code.scopes,
            resource=authorization_code.resource,
            expires_in=self.access_expires_in,
        )

    async def load_refresh_token(self, client, refresh_token: str) -> RefreshToken | None:
        with self._lock:
            self.refresh_requests += 1
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token: RefreshToken, scopes: list[str]) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)  # rotated: a refresh token is good once
        return self._tokens(
            client_id=client.client_id,
            scopes=scopes or refresh_token.scopes,
            resource=refresh_token.resource,
            expires_in=self.access_expires_in,
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _tokens(self, *, client_id, scopes, resource, expires_in: int = 3600) -> OAuthToken:
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=int(time.time()) + expires_in
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(access_token=access, refresh_token=refresh, expires_in=expires_in, scope=" ".join(scopes))


class ClientCredentialsToken:
    """An ASGI token endpoint: grant_type=client_credentials for a known client whose secret matches (HTTP Basic or
    the form), tokens without a refresh token; any other grant goes on to the SDK's endpoint, the body replayed."""

    def __init__(self, provider: ApprovingProvider, sdk_token: Route) -> None:
        self.provider = provider
        self.sdk_token = sdk_token

    async def __call__(self, scope, receive, send) -> None:
        request = Request(scope, receive)
        body = await request.body()
        form = {name: values[0] for name, values in parse_qs(body.decode()).items()}
        if form.get("grant_type") != "client_credentials":
            sent = False

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.sdk_token.handle(scope, replay, send)
            return
        if form.get("client_assertion_type") == JWT_BEARER:
            client_id = self._asserted_client(form.get("client_assertion", ""))
        else:
            client_id = self._secret_client(form, request.headers.get("authorization", ""))
        if client_id is None:
            await JSONResponse({"error": "invalid_client"}, status_code=401)(scope, receive, send)
            return
        with self.provider._lock:
            self.provider.client_credentials_requests += 1
        tokens = self.provider._tokens(
            client_id=client_id, scopes=[], resource=form.get("resource"), expires_in=self.provider.access_expires_in
        )
        tokens.refresh_token = None
        await JSONResponse(tokens.model_dump(mode="json", exclude_none=True))(scope, receive, send)

    def _secret_client(self, form: dict[str, str], header: str) -> str | None:
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if header.startswith("Basic "):
            client_id, _, secret = base64.b64decode(header[6:]).decode().partition(":")
            client_id, secret = unquote(client_id), unquote(secret)
        client = self.provider.clients.get(client_id or "")
        if client is None or not secret or not hmac.compare_digest(client.client_secret or "", secret):
            return None
        return client_id

    def _asserted_client(self, assertion: str) -> str | None:
        """private_key_jwt (RFC 7523 §2.2): signed by the key registered for its issuer (the client id, also its
        subject), for this authorization server (its audience), not expired."""
        import jwt

        try:
            client_id = jwt.decode(assertion, options={"verify_signature": False}).get("iss", "")
            public_key = self.provider.client_keys.get(client_id)
            if public_key is None:
                return None
            claims = jwt.decode(
                assertion,
                public_key,
                algorithms=["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "ES512", "EdDSA"],
                audience=self.provider.issuer,
                options={"require": ["iss", "sub", "aud", "exp"]},
            )
        except jwt.InvalidTokenError:
            return None
        return client_id if claims.get("sub") == client_id else None


JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

# Not forwarded by the proxy at /mcp (hop-by-hop, recomputed, or the token meant for it alone).
DROPPED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "authorization"}


class AuthorizationServer:
    """The authorization server and a protected resource at /resource on one loopback port; with `upstream` (an MCP
    server's URL), that server at /mcp behind the same tokens."""

    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream
        self.provider = ApprovingProvider()
        self._app: ThreadedApp | None = None
        self.url = ""
        self.mcp_refusals = 0  # requests to /mcp refused for want of a valid token (or of its scope)
        # A scope /mcp then demands (403 insufficient_scope without it: a step-up), of every request or of those of
        # one JSON-RPC method (a tool call, say, while discovery still passes).
        self.required_scope: str | None = None
        self.scope_for_method: dict[str, str] = {}
        self.mcp_queries: list[str] = []  # the query string of each request to /mcp, as it came

    def start(self) -> str:
        holder: dict[str, str] = {}

        async def access_of(request: Request) -> AccessToken | None:
            header = request.headers.get("authorization", "")
            token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""
            return await self.provider.load_access_token(token) if token else None

        async def authorized(request: Request) -> bool:
            return await access_of(request) is not None

        def challenge(metadata_path: str) -> JSONResponse:
            metadata = f"{holder['url']}/.well-known/oauth-protected-resource{metadata_path}"
            return JSONResponse(
                {"error": "invalid_token"},
                status_code=401,
                headers={"WWW-Authenticate": f'Bearer error="invalid_token", resource_metadata="{metadata}"'},
            )

        async def resource(request: Request) -> JSONResponse:
            if await authorized(request):
                return JSONResponse({"ok": True})
            return challenge("")

        async def mcp(request: Request):
            self.mcp_queries.append(request.url.query)
            access = await access_of(request)
            if access is None:
                self.mcp_refusals += 1
                return challenge("/mcp")
            required = self.required_scope or self.scope_for_method.get(request.headers.get("mcp-method", ""))
            if required and required not in access.scopes:
                self.mcp_refusals += 1
                metadata = f"{holder['url']}/.well-known/oauth-protected-resource/mcp"
                return JSONResponse(
                    {"error": "insufficient_scope"},
                    status_code=403,
                    headers={
                        "WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{required}", '
                        f'resource_metadata="{metadata}"'
                    },
                )
            headers = {key: value for key, value in request.headers.items() if key.lower() not in DROPPED_HEADERS}
            session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
            try:
                answer = await session.request(
                    request.method, self.upstream, headers=headers, data=await request.body()
                )
            except BaseException:
                await session.close()
                raise

            async def body():
                try:
                    async for chunk in answer.content.iter_any():
                        yield chunk
                finally:
                    answer.release()
                    await session.close()

            kept = {key: value for key, value in answer.headers.items() if key.lower() not in DROPPED_HEADERS}
            return StreamingResponse(body(), status_code=answer.status, headers=kept)

        # The issuer is known only once the port is: the routes are built on first start with a placeholder
        # replaced below (the app is assembled before uvicorn binds).
        app = Starlette()
        self._app = ThreadedApp(app)
        port = self._app.start()
        self.url = holder["url"] = f"http://127.0.0.1:{port}"
        self.provider.issuer = f"{self.url}/"  # as the SDK's metadata spells it
        routes = create_auth_routes(
            self.provider,
            AnyHttpUrl(self.url),
            client_registration_options=ClientRegistrationOptions(enabled=True),
            revocation_options=RevocationOptions(enabled=True),
        )

        def protected_resource(path: str):
            async def metadata(request: Request) -> JSONResponse:
                # The issuer as the SDK's metadata spells it (pydantic gives a bare origin its slash).
                return JSONResponse({"resource": f"{self.url}{path}", "authorization_servers": [f"{self.url}/"]})

            return metadata

        own = [
            Route("/resource", resource, methods=["GET", "POST"]),
            Route("/.well-known/oauth-protected-resource", protected_resource("/resource"), methods=["GET"]),
            Route("/.well-known/oauth-protected-resource/resource", protected_resource("/resource"), methods=["GET"]),
        ]
        if self.upstream is not None:
            own += [
                Route("/mcp", mcp, methods=["GET", "POST", "DELETE"]),
                Route("/.well-known/oauth-protected-resource/mcp", protected_resource("/mcp"), methods=["GET"]),
            ]
        sdk_token = next(route for route in routes if getattr(route, "path", "") == "/token")
        # The client credentials grant, which the SDK's token endpoint does not know, answered here; the rest is the
        # SDK's.
        own.insert(0, Route("/token", ClientCredentialsToken(self.provider, sdk_token), methods=["POST"]))
        for route in [*own, *routes]:
            app.router.routes.append(route)
        return self.url

    def stop(self) -> None:
        if self._app is not None:
            self._app.stop()


@contextlib.contextmanager
def protecting(upstream: str, *, access_expires_in: float | None = None) -> Iterator[AuthorizationServer]:
    """An AuthorizationServer in front of the MCP server at `upstream`, started for the `with` block; its access
    tokens live `access_expires_in` seconds where given."""
    server = AuthorizationServer(upstream=upstream)
    server.start()
    if access_expires_in is not None:
        server.provider.access_expires_in = access_expires_in
    try:
        yield server
    finally:
        server.stop()
