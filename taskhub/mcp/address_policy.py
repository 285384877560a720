"""Where MCP servers may live: an outbound address policy, checked on the resolved address of every connection.

A policy is plain data (networks, host names, host:port pairs) built by the caller (taskhub.servers builds it
from the settings) and carried by an :class:`~taskhub.mcp.client.HttpTarget`. A name is resolved once per
connection, every address it resolves to is checked, and the connection goes to a checked address (never
resolved again by the HTTP library), so a name that resolves to an allowed address when checked and to a
denied one a moment later (DNS rebinding) cannot slip through:

- the SDK path (httpx2): :class:`PolicyTransport` resolves and checks, then sends the request to the checked IP
  with the original Host header and TLS server name (httpcore's `sni_hostname`), so certificates are checked
  against the name as before;
- the lean path (aiohttp): :class:`PolicyResolver` is the connector's resolver; aiohttp connects to what it
  returns (a literal IP, which aiohttp never resolves, is checked by the client before it connects, with
  :meth:`AddressPolicy.check_url`; :meth:`AddressPolicy.resolve` checks a literal too);
- the raw pool (taskhub/mcp/rawhttp.py) connects to what :class:`PolicyResolver` returns, as aiohttp does.

Every path ends in :meth:`AddressPolicy.problem_with_address`, the one judgement of an address, which judges
"this host" (0.0.0.0/8, ::) as loopback and an IPv4-mapped or 6to4 IPv6 address as the IPv4 address it carries.

No Django here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx2

from taskhub.mcp.errors import TransportError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Link-local (where clouds put their metadata services) and the metadata addresses themselves.
DEFAULT_DENIED_NETWORKS = ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32")
DEFAULT_DENIED_HOSTS = (
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "metadata.azure.com",
    "instance-data",
    "instance-data.ec2.internal",
)


class AddressRefused(TransportError):
    """The server's address is one the address policy refuses (checked at registration and at every connection)."""


def _ip(text: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# "This host" (RFC 1122: 0.0.0.0/8; and ::): a connection to it reaches the host's own services, as loopback does.
THIS_HOST_V4 = ipaddress.ip_network("0.0.0.0/8")


def _reached(address: IPAddress) -> IPAddress:
    """What a connection to `address` reaches, judged as that address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return _reached(address.ipv4_mapped)
        if address.sixtofour is not None:
            return _reached(address.sixtofour)
        if address.is_unspecified:
            return ipaddress.IPv6Address("::1")
        return address
    if address in THIS_HOST_V4:
        return ipaddress.IPv4Address("127.0.0.1")
    return address


@dataclass(frozen=True)
class AddressPolicy:
    """Denied networks and host names win; then, when `allowed_networks` is given, only addresses in it pass.

    `denied_endpoints` are (host or IP, port) pairs no MCP server lives at (taskhub's own database and Redis)."""

    denied_networks: tuple[IPNetwork, ...] = ()
    allowed_networks: tuple[IPNetwork, ...] | None = None
    denied_hosts: frozenset[str] = frozenset()
    denied_endpoints: frozenset[tuple[str, int]] = field(default_factory=frozenset)

    @classmethod
    def build(
        cls,
        *,
        denied_networks: Iterable[str] = DEFAULT_DENIED_NETWORKS,
        allowed_networks: Iterable[str] | None = None,
        denied_hosts: Iterable[str] = DEFAULT_DENIED_HOSTS,
        denied_endpoints: Iterable[tuple[str, int]] = (),
    ) -> AddressPolicy:
        allowed = (
            None if allowed_networks is None else tuple(ipaddress.ip_network(n, strict=False) for n in allowed_networks)
        )
        endpoints = set()
        for host, port in denied_endpoints:
            endpoints.add((host.lower(), port))
            endpoints.update((str(address), port) for address in _resolve_now(host, port))
        return cls(
            denied_networks=tuple(ipaddress.ip_network(n, strict=False) for n in denied_networks),
            allowed_networks=allowed,
            denied_hosts=frozenset(host.lower().rstrip(".") for host in denied_hosts),
            denied_endpoints=frozenset(endpoints),
        )

    def problem_with_name(self, host: str, port: int) -> str | None:
        name = host.lower().rstrip(".")
        if name in self.denied_hosts or name.endswith(tuple(f".{denied}" for denied in self.denied_hosts)):
            return f"{host} is a cloud metadata name"
        if (name, port) in self.denied_endpoints:
            return f"{host}:{port} is one of taskhub's own services"
        address = _ip(host)
        return self.problem_with_address(address, port) if address is not None else None

    def problem_with_address(self, address: IPAddress, port: int) -> str | None:
        """The one judgement of an address (the literal of a URL, or what a name resolved to), by what a connection
        to it reaches: 0.0.0.0 and :: reach this host, ::ffff:a.b.c.d and 2002:… (6to4) reach a.b.c.d."""
        reached = _reached(address)
        if reached != address:
            problem = self.problem_with_address(reached, port)
            return f"{address} reaches {reached}, and {problem}" if problem else None
        if (str(address), port) in self.denied_endpoints:
            return f"{address}:{port} is one of taskhub's own services"
        for network in self.denied_networks:
            if address in network:
                return f"{address} is in the denied network {network}"
        if self.allowed_networks is not None and not any(address in n for n in self.allowed_networks):
            return f"{address} is not in an allowed network"
        return None

    def check_name(self, host: str, port: int) -> None:
        problem = self.problem_with_name(host, port)
        if problem:
            raise AddressRefused(f"the address policy refuses {host}:{port}: {problem}")

    def check_url(self, url: str, *, resolve: bool = False) -> None:
        """The URL's host as written (a name or a literal IP) and, with `resolve`, every address it resolves to
        now (a name that does not resolve passes: it is checked again at each connection)."""
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        self.check_name(host, port)
        if resolve and _ip(host) is None:
            for address in _resolve_now(host, port):
                self._check_resolved(host, address, port)

    def _check_resolved(self, host: str, address: IPAddress, port: int) -> None:
        problem = self.problem_with_address(address, port)
        if problem:
            raise AddressRefused(f"the address policy refuses {host}:{port} (resolved to {address}): {problem}")

    async def resolve(self, host: str, port: int) -> list[tuple[int, str]]:
        """(family, IP) of every address of `host`, each checked; refused if any one is denied."""
        self.check_name(host, port)
        literal = _ip(host)
        if literal is not None:
            return [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = []
        for family, _, _, _, sockaddr in infos:
            address = _ip(str(sockaddr[0]))
            if address is None:
                continue
            self._check_resolved(host, address, port)
            if (family, str(address)) not in addresses:
                addresses.append((family, str(sockaddr[0])))
        if not addresses:
            raise TransportError(f"{host} resolves to no address")
        return addresses


def _resolve_now(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [address for *_, sockaddr in infos if (address := _ip(str(sockaddr[0]))) is not None]


class PolicyTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport that sends each request to a checked address of its host (see the module's doc)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, policy: AddressPolicy) -> None:
        self._inner = inner
        self._policy = policy

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = await self._policy.resolve(host, port)
        if _ip(host) is not None:
            return await self._inner.handle_async_request(request)
        extensions = {**request.extensions, "sni_hostname": host}

        def to(address: str) -> httpx2.Request:
            # A copy: the caller's request keeps the name (httpx2 hands it back as response.request, and the SDK
            # judges redirects by its origin); the Host header stays the name's.
            return httpx2.Request(
                request.method,
                url.copy_with(host=address),
                headers=request.headers,
                stream=request.stream,
                extensions=extensions,
            )

        # Each checked address in turn, as a connection to the name would (a refused connect sent nothing).
        for _, address in addresses[:-1]:
            try:
                return await self._inner.handle_async_request(to(address))
            except httpx2.ConnectError:
                continue
        return await self._inner.handle_async_request(to(addresses[-1][1]))

    async def aclose(self) -> None:
        await self._inner.aclose()


class PolicyResolver:
    """An aiohttp resolver (aiohttp.abc.AbstractResolver's interface) that returns checked addresses only."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_UNSPEC) -> list[dict[str, Any]]:
        found = await self._policy.resolve(host, port)
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
