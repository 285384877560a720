"""Asking a server what it is (server/discover, or initialize + tools/list) and recording the answer."""

import asyncio
import logging

from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth import get_user_model

from taskhub.mcp.client import Discovery, TasksClient
from taskhub.mcp.errors import AuthorizationFailed, McpClientError
from taskhub.servers import connect, services
from taskhub.servers.models import Server

logger = logging.getLogger(__name__)

DISCOVERY_TIMEOUT_SECONDS = 15.0


class DiscoveryFailed(Exception):
    """The server could not be asked or answered badly; the message says what happened, for people."""


async def discover(
    server: Server, *, timeout: float = DISCOVERY_TIMEOUT_SECONDS, client: TasksClient | None = None
) -> Discovery:
    """server/discover (capabilities and tools/list), the whole exchange bounded by `timeout`. `client`: one to
    ask through (a stdio server's long-lived process, in the worker that runs it), left open; else a new one."""
    async with asyncio.timeout(timeout):
        if client is not None:
            return await client.discover()
        async with TasksClient(server.to_target(), timeout=timeout) as own:
            return await own.discover()


def wants_oauth(error: BaseException) -> bool:
    """The server refused with HTTP 401 and an OAuth Bearer challenge: an admin must connect it (issue 33)."""
    data = error.data if isinstance(error, AuthorizationFailed) and isinstance(error.data, dict) else {}
    return data.get("httpStatus") == 401 and data.get("bearerChallenge") is True


def describe_failure(error: BaseException, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> str:
    if isinstance(error, TimeoutError):
        return f"No answer within {timeout:g} s."
    if isinstance(error, McpClientError):
        return str(error) or type(error).__name__
    return f"{type(error).__name__}: {error}"


async def adiscover_and_record(
    *, server: Server, user=None, timeout: float = DISCOVERY_TIMEOUT_SECONDS, client: TasksClient | None = None
) -> Discovery:
    """Discover and store the result (or the failure, on the server's health); raises DiscoveryFailed."""
    try:
        discovery = await discover(server, timeout=timeout, client=client)
    except Exception as error:  # whatever went wrong, the caller is told and the server's health says so
        text = describe_failure(error, timeout)
        logger.info("discovery of server %s failed: %s", server.pk, text)
        if wants_oauth(error) and not server.oauth:  # first: the page shows both once the failure is recorded
            await sync_to_async(connect.record_authorization_needed)(server=server)
        await sync_to_async(services.record_discovery_failure)(server=server, error=text)
        raise DiscoveryFailed(text) from error
    await sync_to_async(services.record_discovery)(server=server, discovery=discovery, user=user)
    return discovery


async def adiscover_requested(*, server_id: int, requested_by: int | None, client: TasksClient | None = None) -> str:
    """The background discovery (taskhub.worker.jobs.discover_server): what happened, for the job's log.

    A failure is recorded on the server and shown on its page; it is not retried (the admin asks again)."""
    server = await Server.objects.filter(pk=server_id).afirst()
    if server is None:
        return "server deleted meanwhile"
    if server.removed_at is not None:
        return "server removed meanwhile"
    user = None
    if requested_by is not None:
        user = await get_user_model().objects.filter(pk=requested_by).afirst()
    try:
        discovery = await adiscover_and_record(server=server, user=user, client=client)
    except DiscoveryFailed as failure:
        return f"discovery failed: {failure}"
    return f"discovered {len(discovery.tools)} tools"


def discover_and_record(*, server: Server, user=None, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> Discovery:
    """The same, for sync callers: `manage.py server` and `taskhub demo`, where a person at a terminal waits
    for the answer (the web pages discover in the background, through services.request_discovery)."""
    return async_to_sync(adiscover_and_record)(server=server, user=user, timeout=timeout)
