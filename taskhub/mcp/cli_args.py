"""The command line's arguments and exit statuses: the part of ``python -m taskhub.mcp`` that needs no SDK.

``--help``, a bad argument and a usage error answer from here alone, in the time Python takes to start; only a
command that talks to a server imports :mod:`taskhub.mcp.cli` (the SDK, pydantic, jsonschema: ~2 s of CPU on a slow
machine), after its arguments have been read.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_COMPLETED = 0
EXIT_TOOL_ERROR = 1
EXIT_FAILED = 2
EXIT_CANCELLED = 3
EXIT_PROTOCOL_ERROR = 4
EXIT_USAGE = 5
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command its reader left

DEFAULT_CANCEL_WAIT_S = 30.0
DEFAULT_REQUEST_TIMEOUT_S = 30.0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from taskhub.mcp import cli

    return cli.run(args)


class _ArgumentParser(argparse.ArgumentParser):
    """Bad arguments exit with status 5 (argparse's own 2 means "failed" here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="python -m taskhub.mcp", description="Call MCP tools that may become tasks.")
    commands = parser.add_subparsers(dest="command", required=True)

    call = commands.add_parser("call", help="call a tool and follow its task to the end")
    add_target_arguments(call)
    call.add_argument("tool", help="tool name")
    call.add_argument("--args", metavar="JSON", help="tool arguments as a JSON object")
    call.add_argument(
        "--answer", metavar="KEY=JSON", action="append", default=[], help="response for input key KEY (or '*')"
    )
    call.add_argument("--answers-file", metavar="FILE", help="JSON object mapping keys (or '*') to responses")
    call.add_argument(
        "--cancel-after", metavar="SECONDS", type=seconds(allow_zero=True), help="send tasks/cancel after this long"
    )
    call.add_argument(
        "--cancel-wait",
        metavar="SECONDS",
        type=seconds(allow_zero=False),
        default=DEFAULT_CANCEL_WAIT_S,
        help=f"after the cancel, wait this long for the task to end (default {DEFAULT_CANCEL_WAIT_S:g})",
    )
    call.add_argument("--listen", action="store_true", help="follow the task by notifications instead of polling")
    add_common_arguments(call)

    discover = commands.add_parser("discover", help="show the server's version, capabilities and tools")
    add_target_arguments(discover)
    add_common_arguments(discover)
    return parser


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="Streamable HTTP endpoint, e.g. http://127.0.0.1:8765/mcp")
    target.add_argument("--stdio", metavar="COMMAND", help="server command line (split like a shell)")
    parser.add_argument("--header", metavar="'Name: value'", action="append", default=[], help="extra HTTP header")
    parser.add_argument("--bearer", metavar="TOKEN", help="HTTP bearer token")
    parser.add_argument(
        "--root",
        metavar="URI[=NAME]",
        action="append",
        default=[],
        help="a file:// root to answer roots/list with (repeat for more; none by default)",
    )
    add_oauth_arguments(parser)


CLIENT_AUTH_METHODS = ("client_secret_basic", "client_secret_post", "none")
# The flags that turn OAuth on (with --url); --oauth alone uses a Client ID Metadata Document or dynamic registration.
OAUTH_FLAGS = (
    "oauth",
    "oauth_unattended",
    "client_id",
    "client_secret_file",
    "client_credentials",
    "private_key_file",
    "client_metadata_url",
    "client_auth",
    "jwt_algorithm",
    "scope",
    "issuer",
    "token_file",
)


def add_oauth_arguments(parser: argparse.ArgumentParser) -> None:
    oauth = parser.add_argument_group(
        "authorization (OAuth, --url only)",
        "Authorize when the server demands it (HTTP 401, or 403 insufficient_scope). Any of these flags but "
        "--redirect-port turns it on (by default as a person, --oauth). "
        "Tokens are kept in memory for this run only, unless --token-file says where; they are never printed.",
    )
    oauth.add_argument(
        "--oauth",
        action="store_true",
        help="authorize as a person: prints the URL to open and waits for the redirect to 127.0.0.1",
    )
    oauth.add_argument(
        "--oauth-unattended",
        action="store_true",
        help="authorize without a person: follow the authorization URL and take the code from its redirect "
        "(for authorization servers that approve by themselves)",
    )
    oauth.add_argument(
        "--redirect-port", metavar="PORT", type=port_number, default=0, help="loopback redirect port (default: any)"
    )
    oauth.add_argument("--client-id", metavar="ID", help="a client registered beforehand (else CIMD or registration)")
    oauth.add_argument("--client-secret-file", metavar="FILE", help="file holding that client's secret")
    oauth.add_argument(
        "--client-auth",
        choices=CLIENT_AUTH_METHODS,
        help="how the client authenticates at the token endpoint (default: basic with a secret, else none)",
    )
    oauth.add_argument(
        "--client-credentials",
        action="store_true",
        help="use the client-credentials grant (no person): --client-id, --client-secret-file or --private-key-file",
    )
    oauth.add_argument(
        "--private-key-file", metavar="PEM", help="private key signing a JWT client assertion (client credentials)"
    )
    oauth.add_argument("--jwt-algorithm", metavar="ALG", help="the assertion's algorithm (default: from the key)")
    oauth.add_argument(
        "--client-metadata-url",
        metavar="URL",
        help="this client's Client ID Metadata Document (https), used where the authorization server supports it",
    )
    oauth.add_argument("--scope", metavar="SCOPES", help="scopes to ask for besides those the server names")
    oauth.add_argument(
        "--issuer", metavar="URL", help="the authorization server the client credentials belong to (sent nowhere else)"
    )
    oauth.add_argument(
        "--token-file",
        metavar="FILE",
        help="keep tokens and the client's registration in FILE (created 0600) for later runs against this server",
    )


def oauth_requested(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) for name in OAUTH_FLAGS)


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be a port number from 0 to 65535")
    return value


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=seconds(allow_zero=False),
        help="give up after this long overall (also caps each request)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def seconds(*, allow_zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, positive (or also zero)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"must be {'zero or more' if allow_zero else 'more than zero'} seconds")
        return value

    return parse
