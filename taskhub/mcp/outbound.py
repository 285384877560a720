"""How taskhub connects out: one factory for every HTTP stack, the address policy decided at each connection.

taskhub reaches MCP servers through two HTTP stacks and a pool of its own: httpx2 (under the SDK's session: launches,
answers, cancels, discovery; and webhooks), aiohttp (the tracker's `tasks/get`) and the raw keep-alive pool
(taskhub/mcp/rawhttp.py, the tracker's plain case, kept for its measured cost: see that module). Each gets its
connections from one :class:`Outbound`, so what may be reached is decided in one place,
:meth:`Outbound.addresses` (the policy's :meth:`~taskhub.mcp.address_policy.AddressPolicy.resolve`: the name is
judged, resolved once, and every address it resolves to judged), at the moment a connection is opened, and every
connection is then made to one of those checked addresses, never to the name (DNS rebinding cannot slip through):

- httpx2: :meth:`Outbound.httpx_transport` sends each request to a checked address with the name kept as the Host
  header and TLS server name (httpcore's public `sni_hostname` extension);
- aiohttp: :meth:`Outbound.aiohttp_connector`'s resolver returns checked addresses only (aiohttp never resolves a
  literal IP: its caller judges the URL's literal with :meth:`~taskhub.mcp.address_policy.AddressPolicy.check_url`
  before the first request);
- the raw pool: :meth:`Outbound.open_connection` tries each checked address in turn, as the other two do.

All three verify TLS with one context (:func:`tls_context`). Whatever connects out next (an authorization server,
a new webhook kind) takes an :class:`Outbound` too. With no policy (the CLI) connections go where names resolve.

No Django here.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx2

from taskhub.mcp.address_policy import AddressPolicy, parse_ip

if TYPE_CHECKING:
    import aiohttp


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx2's default verifying TLS context, built once per process and shared by every client and stack.

    Building it loads the CA bundle: about 60 ms of CPU (bench/approval.py's profile), which each new
    TasksClient paid before its first request (every delivery job, cancel and discovery), on the caller's
    event loop. A context is safe to share; SSL_CERT_FILE / SSL_CERT_DIR are read on first use."""
    return httpx2.create_ssl_context()


class Outbound:
    """The connections of one client, to wherever `policy` allows (anywhere when it is None)."""

    __slots__ = ("policy",)

    def __init__(self, policy: AddressPolicy | None) -> None:
        self.policy = policy

    async def addresses(self, host: str, port: int) -> list[tuple[int, str]]:
        """(family, IP) of each address a connection to host:port may go to, every one checked; AddressRefused
        when the name or any address it resolves to is refused."""
        if self.policy is None:
            return [(socket.AF_UNSPEC, host)]
        return await self.policy.resolve(host, port)

    async def connect[T](self, host: str, port: int, open_one: Callable[[str], Awaitable[T]]) -> T:
        """`open_one(address)` on each checked address in turn until one connects (a refused connect sent
        nothing); the last one's error otherwise."""
        addresses = await self.addresses(host, port)
        for _, address in addresses[:-1]:
            try:
                return await open_one(address)
            except (OSError, httpx2.ConnectError):
                continue
        return await open_one(addresses[-1][1])

    # --- the three stacks ---------------------------------------------------------------------------------------

    def httpx_client(self, *, limits: httpx2.Limits | None = None, **options: Any) -> httpx2.AsyncClient:
        """An httpx2 client (`options` as AsyncClient's) whose connections go to checked addresses. Without a
        policy it is httpx2's own, proxies from the environment included (the CLI behind a company proxy); with
        one, no proxy (a proxy would connect where the policy cannot see)."""
        limits = limits or httpx2.Limits(max_connections=100, max_keepalive_connections=20)  # httpx2's default
        if self.policy is None:
            return httpx2.AsyncClient(verify=tls_context(), limits=limits, **options)
        transport = _CheckedTransport(httpx2.AsyncHTTPTransport(verify=tls_context(), limits=limits), self)
        return httpx2.AsyncClient(transport=transport, **options)

    def aiohttp_connector(self, *, limit: int) -> aiohttp.TCPConnector:
        import aiohttp  # the tracker's stack: a quarter of a second of imports the CLI and the pages do without

        return aiohttp.TCPConnector(
            limit=limit,
            ssl=tls_context(),
            resolver=_CheckedResolver(self) if self.policy is not None else None,
        )

    async def open_connection[P: asyncio.BaseProtocol](
        self, protocol: Callable[[], P], host: str, port: int, *, use_tls: bool
    ) -> P:
        loop = asyncio.get_running_loop()

        async def open_one(address: str) -> P:
            _, opened = await loop.create_connection(
                protocol,
                address,
                port,
                ssl=tls_context() if use_tls else None,
                server_hostname=host if use_tls else None,
            )
            return opened

        return await self.connect(host, port, open_one)


class _CheckedTransport(httpx2.AsyncBaseTransport):
    """Sends each request to a checked address of its host (see the module's doc)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, outbound: Outbound) -> None:
        self._inner = inner
        self._outbound = outbound

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        host = url.host
        if parse_ip(host) is not None:
            await self._outbound.addresses(host, url.port or (443 if url.scheme == "https" else 80))
            return await self._inner.handle_async_request(request)
        extensions = {**request.extensions, "sni_hostname": host}

        async def to(address: str) -> httpx2.Response:
            # A copy: the caller's request keeps the name (httpx2 hands it back as response.request, and the SDK
            # judges redirects by its origin); the Host header stays the name's.
            checked = httpx2.Request(
                request.method,
                url.copy_with(host=address),
                headers=request.headers,
                stream=request.stream,
                extensions=extensions,
            )
            return await self._inner.handle_async_request(checked)

        return await self._outbound.connect(host, url.port or (443 if url.scheme == "https" else 80), to)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CheckedResolver:
    """An aiohttp resolver (aiohttp.abc.AbstractResolver's interface) that returns checked addresses only."""

    def __init__(self, outbound: Outbound) -> None:
        self._outbound = outbound

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_UNSPEC) -> list[dict[str, Any]]:
        found = await self._outbound.addresses(host, port)
        wanted = [(kind, address) for kind, address in found if family in (socket.AF_UNSPEC, kind)] or found
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": kind,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for kind, address in wanted
        ]

    async def close(self) -> None:
        pass
