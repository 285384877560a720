"""A server's discovered tool catalogue, for tests that launch without a real discovery.

services.launch only launches a tool of the server's catalogue, with arguments that fit its inputSchema.
"""

from typing import Any

from django.utils import timezone

from taskhub.servers.models import Server

ANY_ARGUMENTS = {"type": "object"}


def with_tools(server: Server, *tools: str | dict[str, Any]) -> Server:
    """`server` as discovery leaves it with `tools` (names, taking any arguments, or tool objects) added;
    a tool it already lists is kept as listed."""
    known = server.tools if isinstance(server.tools, list) else []
    names = {tool.get("name") for tool in known if isinstance(tool, dict)}
    listed = [tool if isinstance(tool, dict) else {"name": tool, "inputSchema": ANY_ARGUMENTS} for tool in tools]
    catalogue = known + [tool for tool in listed if tool["name"] not in names]
    Server.objects.filter(pk=server.pk).update(tools=catalogue, discovered_at=timezone.now())
    server.refresh_from_db()
    return server
