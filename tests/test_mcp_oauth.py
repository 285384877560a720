"""taskhub.mcp.oauth, the command line's OAuth flags, and what is not covered by the conformance suite's auth scenarios
(tests/test_conformance.py runs those end to end): a person's bad settings refused before connecting, the token file
(0600, bound to its server), the loopback redirect (RFC 8252), and the address policy judging the authorization
server's address as it judges the MCP server's."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from pathlib import Path

import pytest
from mcp.shared.auth import OAuthToken
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from taskhub.mcp.address_policy import AddressPolicy
from taskhub.mcp.cli import main
from taskhub.mcp.client import HttpTarget, TasksClient
from taskhub.mcp.errors import McpClientError
from taskhub.mcp.oauth import (
    AuthorizationProblem,
    FileTokenStore,
    LoopbackRedirect,
    MemoryTokenStore,
    OAuthClientSettings,
    oauth_provider,
)
from tests.threaded_app import ThreadedApp

CLOSED_URL = "http://127.0.0.1:1/mcp"  # connecting would exit 4, not 5


def exit_status(argv: list[str]) -> int | str | None:
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse's own errors
        return exit_.code


@pytest.fixture
def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_text("s3cret-value\n")
    return str(path)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--stdio", "whatever", "--oauth"], "--url only"),
        (["--url", CLOSED_URL, "--oauth", "--bearer", "token"], "cannot be combined"),
        (["--url", CLOSED_URL, "--client-credentials"], "needs a client id"),
        (["--url", CLOSED_URL, "--client-credentials", "--client-id", "c"], "a client secret or a private key"),
        (["--url", CLOSED_URL, "--client-id", "c", "--client-secret-file", "/nonexistent/secret"], "cannot read"),
        (["--url", CLOSED_URL, "--client-metadata-url", "http://example.com/client.json"], "https with a path"),
        (["--url", CLOSED_URL, "--oauth", "--redirect-port", "70000"], "port number"),
        (["--url", CLOSED_URL, "--client-auth", "client_secret_post", "--client-id", "c"], "needs a client secret"),
    ],
)
def test_bad_oauth_settings_are_refused_before_connecting(options, said, capsys) -> None:
    assert exit_status(["discover", *options]) == 5
    captured = capsys.readouterr()
    assert captured.out == ""
    assert said in captured.err


def test_a_private_key_that_is_not_one_is_refused(tmp_path: Path, capsys) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    options = ["--client-credentials", "--client-id", "c", "--private-key-file", str(key)]
    assert exit_status(["discover", "--url", CLOSED_URL, *options]) == 5
    assert "not an unencrypted PEM private key" in capsys.readouterr().err


def test_the_token_file_is_the_owners_only_and_bound_to_its_server(tmp_path: Path, capsys) -> None:
    path = tmp_path / "tokens.json"
    store = FileTokenStore(path, resource="https://mcp.example.com/mcp")
    asyncio.run(store.set_tokens(OAuthToken(access_token="at-secret", refresh_token="rt-secret", expires_in=60)))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "at-secret" not in repr(store)

    again = FileTokenStore(path, resource="https://mcp.example.com/mcp")
    assert asyncio.run(again.get_tokens()).refresh_token == "rt-secret"

    # Another server's tokens are never sent to this one: the file is refused, before any connection.
    with pytest.raises(AuthorizationProblem, match="another server"):
        FileTokenStore(path, resource="https://other.example.com/mcp").load()
    assert exit_status(["discover", "--url", CLOSED_URL, "--oauth-unattended", "--token-file", str(path)]) == 5
    assert "holds tokens for another server" in capsys.readouterr().err

    path.write_text("[1, 2]")
    with pytest.raises(AuthorizationProblem, match="not one taskhub wrote"):
        FileTokenStore(path, resource="https://mcp.example.com/mcp").load()


def test_secrets_stay_out_of_reprs() -> None:
    settings = OAuthClientSettings(client_id="c", client_secret="cs-secret", private_key_pem="pem-secret")
    assert "cs-secret" not in repr(settings) and "pem-secret" not in repr(settings)


async def browser_visits(url: str) -> tuple[int, str]:
    """One GET the way a browser follows the authorization server's redirect; the status and body."""
    host_port, _, path = url.removeprefix("http://").partition("/")
    host, _, port = host_port.partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\n\r\n".encode())
    await writer.drain()
    answer = (await reader.read()).decode()
    writer.close()
    return int(answer.split(" ", 2)[1]), answer


def test_the_loopback_redirect_takes_the_code_from_the_browser() -> None:
    announced: list[str] = []

    async def scenario():
        async with LoopbackRedirect(announce=announced.append) as redirect:
            assert redirect.redirect_uri.startswith("http://127.0.0.1:")
            assert redirect.redirect_uri.endswith("/callback")
            await redirect.redirect_handler("https://as.example.com/authorize?state=abc")
            base = redirect.redirect_uri.removesuffix("/callback")
            status, _ = await browser_visits(f"{base}/favicon.ico")
            assert status == 404  # only the redirect path is answered
            status, page = await browser_visits(f"{redirect.redirect_uri}?code=the-code&state=abc&iss=https%3A%2F%2Fas")
            assert status == 200 and "<script" not in page
            return await redirect.callback_handler()

    result = asyncio.run(scenario())
    assert announced == ["https://as.example.com/authorize?state=abc"]
    assert (result.code, result.state, result.iss) == ("the-code", "abc", "https://as")


def test_the_loopback_redirect_reports_a_refusal() -> None:
    async def scenario():
        async with LoopbackRedirect(announce=lambda url: None) as redirect:
            await redirect.redirect_handler("https://as.example.com/authorize")
            await browser_visits(f"{redirect.redirect_uri}?error=access_denied&error_description=%1B%5B31mno")
            return await redirect.callback_handler()

    with pytest.raises(AuthorizationProblem, match=r"refused: access_denied: \[31mno"):
        asyncio.run(scenario())


def protected_server(authorization_server: str) -> ThreadedApp:
    """A resource server that demands OAuth and names `authorization_server` in its metadata (RFC 9728)."""

    async def mcp(request: Request) -> Response:
        metadata_url = f"{request.base_url}.well-known/oauth-protected-resource/mcp"
        challenge = f'Bearer resource_metadata="{metadata_url}"'
        return Response(status_code=401, headers={"WWW-Authenticate": challenge})

    async def metadata(request: Request) -> JSONResponse:
        return JSONResponse({"resource": f"{request.base_url}mcp", "authorization_servers": [authorization_server]})

    return ThreadedApp(
        Starlette(
            routes=[
                Route("/mcp", mcp, methods=["GET", "POST"]),
                Route("/.well-known/oauth-protected-resource/mcp", metadata),
            ]
        )
    )


def test_the_authorization_server_is_reached_through_the_address_policy(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    # The resource server (loopback, allowed) names a cloud metadata address as its authorization server.
    server = protected_server("http://169.254.169.254/")
    port = server.start()
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        provider = oauth_provider(
            server_url=url,
            settings=OAuthClientSettings(client_id="c", client_secret="cs-secret", client_credentials=True),
            storage=MemoryTokenStore(),
            redirect=None,
        )
        target = HttpTarget(url=url, address_policy=AddressPolicy.build(), auth=provider)

        async def discover():
            async with TasksClient(target, timeout=10) as client:
                await client.discover()

        with pytest.raises(McpClientError) as raised:
            asyncio.run(discover())
    finally:
        server.stop()
    assert "169.254.169.254" in str(raised.value)
    assert "cs-secret" not in caplog.text


def test_without_oauth_flags_a_401_says_how_to_authorize(capsys) -> None:
    server = protected_server("http://127.0.0.1:1/")
    port = server.start()
    try:
        assert exit_status(["discover", "--url", f"http://127.0.0.1:{port}/mcp", "--timeout", "20"]) == 4
    finally:
        server.stop()
    said = capsys.readouterr().err
    assert "HTTP 401 Unauthorized" in said and "authorize with --oauth" in said


def test_a_token_response_that_fails_validation_is_not_quoted(tmp_path: Path) -> None:
    """The SDK quotes a token response that fails validation (pydantic's input_value): neither the message nor the
    SDK's log record may carry it."""
    from mcp.client.auth import OAuthTokenError

    provider = oauth_provider(
        server_url="https://mcp.example.com/mcp",
        settings=OAuthClientSettings(client_id="c", client_secret="cs", client_credentials=True),
        storage=MemoryTokenStore(),
        redirect=None,
    )
    provider.failure = OAuthTokenError(f"Invalid token response: {json.dumps({'access_token': 'at-secret'})}")
    assert provider.failure_message() == "OAuthTokenError: Invalid token response"


def test_a_kept_token_that_expired_is_refreshed_at_the_kept_token_endpoint(tmp_path: Path) -> None:
    """A later run (or process) with the token file refreshes an expired token by itself, at the authorization
    server's own token endpoint found by the earlier discovery, with the resource parameter; nobody asked again."""
    import time

    import httpx2
    from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, ProtectedResourceMetadata

    from taskhub.mcp.oauth import Discovery, UnattendedRedirect
    from taskhub.mcp.outbound import Outbound

    resource = "https://mcp.example.com/mcp"
    path = tmp_path / "tokens.json"
    store = FileTokenStore(path, resource=resource)

    async def keep() -> None:
        await store.set_tokens(OAuthToken(access_token="old-at", refresh_token="rt-1", expires_in=60))
        await store.set_client_info(OAuthClientInformationFull(client_id="registered", redirect_uris=None))
        metadata = OAuthMetadata(
            issuer="https://as.example.com",
            authorization_endpoint="https://as.example.com/authorize",
            token_endpoint="https://as.example.com/oauth/token",
        )
        prm = ProtectedResourceMetadata(resource=resource, authorization_servers=["https://as.example.com"])
        await store.set_discovery(Discovery(prm, metadata, "https://as.example.com"))

    asyncio.run(keep())
    document = json.loads(path.read_text())
    document["expires_at"] = time.time() - 1  # expired since
    path.write_text(json.dumps(document))

    provider = oauth_provider(
        server_url=resource,
        settings=OAuthClientSettings(),
        storage=FileTokenStore(path, resource=resource),
        redirect=UnattendedRedirect(outbound=Outbound(None)),
    )

    async def one_request() -> tuple[httpx2.Request, httpx2.Request]:
        request = httpx2.Request("POST", resource, headers={"MCP-Protocol-Version": "2026-07-28"})
        flow = provider.async_auth_flow(request)
        refresh = await flow.__anext__()
        renewed = {"access_token": "new-at", "token_type": "Bearer", "expires_in": 3600}
        sent = await flow.asend(httpx2.Response(200, json=renewed, request=refresh))
        with pytest.raises(StopAsyncIteration):
            await flow.asend(httpx2.Response(200, json={}, request=sent))
        return refresh, sent

    refresh, sent = asyncio.run(one_request())
    assert str(refresh.url) == "https://as.example.com/oauth/token"
    form = dict(item.split("=", 1) for item in refresh.content.decode().split("&"))
    assert form["grant_type"] == "refresh_token" and form["refresh_token"] == "rt-1"
    assert form["resource"] == "https%3A%2F%2Fmcp.example.com%2Fmcp"
    assert sent.headers["Authorization"] == "Bearer new-at"
    kept = json.loads(path.read_text())
    assert kept["tokens"]["access_token"] == "new-at" and kept["tokens"]["refresh_token"] == "rt-1"
    assert kept["expires_at"] > time.time() + 3000
