"""Which tools an endpoint offers: one server's under their own names (`/mcp/servers/<name>`), or every enabled
server's the user may launch, named `<server>__<tool>` (`/mcp`). Entries are the stored catalogue's, as the server
sent them (schemas, annotations, `x-mcp-header` metadata), renamed only on the aggregate endpoint."""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any

from taskhub.accounts import permissions
from taskhub.database.prepared import prepared_cursor
from taskhub.servers.catalogue import MAX_TOOLS
from taskhub.servers.models import Server
from taskhub.tasks import raw_rows

logger = logging.getLogger(__name__)

SEPARATOR = "__"
# The spec's tool names: 1 to 128 characters of A-Z a-z 0-9 _ - . (SEP-986).
TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


def valid_tool_name(name: str) -> bool:
    return TOOL_NAME.fullmatch(name) is not None


def _raw_tools(server: Server) -> list[dict[str, Any]]:
    tools = server.tools if isinstance(server.tools, list) else []
    return [tool for tool in tools[:MAX_TOOLS] if isinstance(tool, dict) and isinstance(tool.get("name"), str)]


def live_servers():
    return Server.objects.filter(enabled=True, removed_at__isnull=True).order_by("name")


def live_server_named(name: str) -> Server | None:
    """The server of this name if it is neither disabled nor removed (at most one: server_name_unique_in_use), as
    live_servers() would give it, in one statement written and prepared once: every tools/call reads it."""
    with prepared_cursor() as cursor:
        cursor.execute(_live_server_named_sql(), [name])
        row = cursor.fetchone()
    return None if row is None else raw_rows.instances(row, (Server,))[0]


@functools.cache
def _live_server_named_sql() -> str:
    columns = ", ".join(raw_rows.columns("s", Server))
    return (
        f'SELECT {columns} FROM "{Server._meta.db_table}" s '
        'WHERE s."name" = %s AND s."enabled" AND s."removed_at" IS NULL'
    )


@dataclass(frozen=True)
class Endpoint:
    """One server's endpoint (`server_name`), or the aggregate one (None)."""

    server_name: str | None = None

    @property
    def aggregate(self) -> bool:
        return self.server_name is None

    def server(self) -> Server | None:
        """The endpoint's server, if it exists and is neither disabled nor removed."""
        if self.server_name is None:
            return None
        return live_server_named(self.server_name)

    def tools(self, user) -> list[dict[str, Any]]:
        if not self.aggregate:
            server = self.server()
            if server is None or not permissions.may_launch_through_token(user, server):
                return []
            return _raw_tools(server)
        listed: list[dict[str, Any]] = []
        for server in live_servers():
            if not permissions.may_launch_through_token(user, server):
                continue
            if SEPARATOR in server.name or not valid_tool_name(server.name + SEPARATOR + "x"):
                logger.warning("gateway /mcp: server %r skipped: its name makes no valid tool name", server.name[:100])
                continue
            for tool in _raw_tools(server):
                name = server.name + SEPARATOR + tool["name"]
                if valid_tool_name(name):
                    listed.append({**tool, "name": name})
        return listed

    def resolve(self, name: str) -> tuple[Server, str] | None:
        """(server, tool name at that server) for a tool name the agent called, or None."""
        if not self.aggregate:
            server = self.server()
            return (server, name) if server is not None else None
        server_name, separator, tool = name.partition(SEPARATOR)
        if not separator or not tool:
            return None
        server = live_server_named(server_name)
        return (server, tool) if server is not None and SEPARATOR not in server.name else None
