"""Where MCP servers may live: an outbound address policy, checked on the resolved address of every connection.

A policy is plain data (networks, host names, host:port pairs) built by the caller (taskhub.servers builds it
from the settings) and carried by an :class:`~taskhub.mcp.client.HttpTarget`. It judges; it does not connect:
taskhub/mcp/outbound.py opens every outbound connection (httpx2, aiohttp and the raw pool alike) to an address
:meth:`AddressPolicy.resolve` returned, which judges the name, resolves it once and judges every address it resolves
to, so a name that resolves to an allowed address when checked and to a denied one a moment later (DNS rebinding)
cannot slip through. Registration checks a URL ahead of time with :meth:`AddressPolicy.check_url`.

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
from urllib.parse import urlsplit

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


def parse_ip(text: str) -> IPAddress | None:
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
        address = parse_ip(host)
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
        if resolve and parse_ip(host) is None:
            for address in _resolve_now(host, port):
                self._check_resolved(host, address, port)

    def _check_resolved(self, host: str, address: IPAddress, port: int) -> None:
        problem = self.problem_with_address(address, port)
        if problem:
            raise AddressRefused(f"the address policy refuses {host}:{port} (resolved to {address}): {problem}")

    async def resolve(self, host: str, port: int) -> list[tuple[int, str]]:
        """(family, IP) of every address of `host`, each checked; refused if any one is denied."""
        self.check_name(host, port)
        literal = parse_ip(host)
        if literal is not None:
            return [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = []
        for family, _, _, _, sockaddr in infos:
            address = parse_ip(str(sockaddr[0]))
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
    return [address for *_, sockaddr in infos if (address := parse_ip(str(sockaddr[0]))) is not None]
