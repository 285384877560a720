"""`manage.py server add|update|discover|list`: the server registry from scripts.

Secrets never go on the command line (it shows in process lists and shell history): the bearer token,
header values and stdio environment values are read from environment variables named here.
"""

import json
import os

from django.core.management.base import BaseCommand, CommandError
from django.db.models import F

from taskhub.servers.catalogue import endpoint_of, health_of
from taskhub.servers.discovery import DiscoveryFailed, discover_and_record
from taskhub.servers.errors import ServerConfigInvalid, ServerRemoved
from taskhub.servers.models import Server, Transport
from taskhub.servers.services import create_server, update_server


def _from_env(pairs: list[str], what: str) -> dict[str, str]:
    values = {}
    for pair in pairs:
        name, sep, variable = pair.partition("=")
        if not sep or not name.strip() or not variable.strip():
            raise CommandError(f"{what} {pair!r}: write NAME=ENVIRONMENT_VARIABLE")
        if variable.strip() not in os.environ:
            raise CommandError(f"{what} {name.strip()}: the environment variable {variable.strip()} is not set")
        values[name.strip()] = os.environ[variable.strip()]
    return values


class Command(BaseCommand):
    help = "Add, update, discover or list MCP servers."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        for action in ("add", "update"):
            sub = actions.add_parser(action, help=f"{action} a server")
            sub.add_argument("name")
            endpoint = sub.add_mutually_exclusive_group(required=action == "add")
            endpoint.add_argument("--url", help="Streamable HTTP endpoint")
            endpoint.add_argument("--command", dest="stdio_command", help="stdio: the program to start")
            sub.add_argument("--arg", action="append", default=None, help="stdio: one argument (repeat)")
            sub.add_argument("--bearer-token-env", metavar="VAR", help="read the bearer token from $VAR")
            sub.add_argument("--header-env", action="append", default=[], metavar="NAME=VAR", help="HTTP header")
            sub.add_argument("--env-var", action="append", default=[], metavar="NAME=VAR", help="stdio env")
            sub.add_argument("--enabled", choices=["true", "false"], help="enable or disable")
            sub.add_argument("--discover", action="store_true", help="discover it afterwards")
        discover = actions.add_parser("discover", help="ask a server for its capabilities and tools")
        discover.add_argument("name")
        listing = actions.add_parser("list", help="the registered servers")
        listing.add_argument("--json", action="store_true")
        listing.add_argument("--all", action="store_true", help="removed servers too, marked removed")

    def handle(self, *args, action, **options):
        if action == "list":
            return self._list(as_json=options["json"], removed_too=options["all"])
        if action == "discover":
            return self._discover(self._server(options["name"]))
        changes = self._changes(options)
        try:
            if action == "add":
                if Server.objects.filter(name=options["name"], removed_at__isnull=True).exists():
                    raise CommandError(f"A server named {options['name']!r} exists; use `server update`.")
                server = create_server(name=options["name"], user=None, **changes)
                self.stdout.write(f"added {server.name} ({endpoint_of(server)})")
            else:
                server = self._server(options["name"])
                server = update_server(server=server, user=None, **changes)
                self.stdout.write(f"updated {server.name}")
        except (ServerConfigInvalid, ServerRemoved) as invalid:
            raise CommandError(f"Not saved: {invalid}") from invalid
        if options["discover"]:
            self._discover(server)

    def _changes(self, options) -> dict:
        changes: dict = {}
        if options["url"]:
            changes.update(transport=Transport.HTTP, url=options["url"])
        if options["stdio_command"]:
            changes.update(transport=Transport.STDIO, command=options["stdio_command"])
        if options["arg"] is not None:
            changes["args"] = options["arg"]
        if options["bearer_token_env"]:
            variable = options["bearer_token_env"]
            if variable not in os.environ:
                raise CommandError(f"The environment variable {variable} is not set")
            changes["bearer_token"] = os.environ[variable]
        if options["header_env"]:
            changes["headers"] = _from_env(options["header_env"], "header")
        if options["env_var"]:
            changes["env"] = _from_env(options["env_var"], "environment variable")
        if options["enabled"]:
            changes["enabled"] = options["enabled"] == "true"
        return changes

    def _server(self, name: str) -> Server:
        server = Server.named(name)
        if server is None:
            raise CommandError(f"No server named {name!r}.")
        return server

    def _discover(self, server: Server) -> None:
        try:
            discovery = discover_and_record(server=server)
        except DiscoveryFailed as failure:
            raise CommandError(f"Discovery of {server.name} failed: {failure}") from failure
        names = ", ".join(str(tool.get("name")) for tool in discovery.tools)
        self.stdout.write(f"discovered {server.name}: {len(discovery.tools)} tools ({names})")

    def _list(self, *, as_json: bool, removed_too: bool) -> None:
        servers = Server.objects.order_by("name", F("removed_at").desc(nulls_first=True))
        if not removed_too:
            servers = servers.filter(removed_at__isnull=True)
        rows = [
            {
                "name": server.name,
                "transport": server.transport,
                "endpoint": endpoint_of(server),
                "enabled": server.enabled,
                "health": health_of(server),
                "tools": [tool.get("name") for tool in server.tools or [] if isinstance(tool, dict)],
                "removed_at": server.removed_at.isoformat() if server.removed_at else None,
            }
            for server in servers
        ]
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        for row in rows:
            state = "removed" if row["removed_at"] else "enabled" if row["enabled"] else "disabled"
            self.stdout.write(f"{row['name']}\t{row['endpoint']}\t{state}\t{row['health']}\t{len(row['tools'])} tools")
