"""Asking a server what it is (server/discover, or initialize + tools/list) and recording the answer."""

import asyncio
import logging

from asgiref.sync import async_to_sync, sync_to_async

from taskhub.mcp.client import Discovery, TasksClient
from taskhub.mcp.errors import McpClientError
from taskhub.servers import services
from taskhub.servers.models import Server

logger = logging.getLogger(__name__)

DISCOVERY_TIMEOUT_SECONDS = 15.0


class DiscoveryFailed(Exception):
    """The server could not be asked or answered badly; the message says what happened, for people."""


async def discover(server: Server, *, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> Discovery:
    """server/discover (capabilities and tools/list), the whole exchange bounded by `timeout`."""
    async with asyncio.timeout(timeout):
        async with TasksClient(server.to_target(), timeout=timeout) as client:
            return await client.discover()


def describe_failure(error: BaseException, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> str:
    if isinstance(error, TimeoutError):
        return f"No answer within {timeout:g} s."
    if isinstance(error, McpClientError):
        return str(error) or type(error).__name__
    return f"{type(error).__name__}: {error}"


async def adiscover_and_record(*, server: Server, user=None, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> Discovery:
    """Discover and store the result (or the failure, on the server's health); raises DiscoveryFailed."""
    try:
        discovery = await discover(server, timeout=timeout)
    except Exception as error:  # whatever went wrong, the caller is told and the server's health says so
        text = describe_failure(error, timeout)
        logger.info("discovery of server %s failed: %s", server.pk, text)
        await sync_to_async(services.record_server_failure)(server=server, error=text)
        raise DiscoveryFailed(text) from error
    await sync_to_async(services.record_discovery)(server=server, discovery=discovery, user=user)
    return discovery


def discover_and_record(*, server: Server, user=None, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> Discovery:
    """The same, for sync callers (management commands, the demo launcher)."""
    return async_to_sync(adiscover_and_record)(server=server, user=user, timeout=timeout)
