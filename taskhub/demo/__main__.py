"""Command line of the demo server; see docs/demo-server-contract.md."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys

import anyio

from taskhub.demo.server import DemoConfig, serve


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _ttl(text: str) -> int | None:
    return None if text.lower() == "none" else _positive_int(text)


def parse_args(argv: list[str] | None = None) -> DemoConfig:
    parser = argparse.ArgumentParser(prog="python -m taskhub.demo", description="taskhub demo MCP server (Tasks)")
    transport = parser.add_mutually_exclusive_group(required=True)
    transport.add_argument("--http", action="store_true", help="serve Streamable HTTP at http://HOST:PORT/mcp")
    transport.add_argument("--stdio", action="store_true", help="serve over stdin/stdout")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed once ready)")
    parser.add_argument("--state", metavar="FILE", help="SQLite file holding the tasks (default: in memory)")
    parser.add_argument("--poll-interval-ms", type=_positive_int, default=1000, metavar="MS")
    parser.add_argument("--ttl-ms", type=_ttl, default=86_400_000, metavar="MS|none", help="task TTL; none = unlimited")
    parser.add_argument("--conformance", action="store_true", help="also offer the conformance suite's fixture tools")
    parser.add_argument(
        "--hostile", action="store_true", help="also offer markup_probe, whose every text is an HTML injection attempt"
    )
    parser.add_argument("--require-token", metavar="TOKEN", help="HTTP only: require Authorization: Bearer TOKEN")
    parser.add_argument(
        "--get-delay-ms",
        type=int,
        default=0,
        metavar="MS",
        help="hold each tasks/get this long (makes overlap visible)",
    )
    parser.add_argument(
        "--update-delay-ms",
        type=int,
        default=0,
        metavar="MS",
        help="hold each tasks/update this long before applying it (a slow server, for delivery fault tests)",
    )
    parser.add_argument(
        "--list-delay-ms",
        type=int,
        default=0,
        metavar="MS",
        help="hold each tools/list this long (a slow server, for tests of background discovery)",
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    return DemoConfig(
        transport="http" if args.http else "stdio",
        host=args.host,
        port=args.port,
        state=args.state,
        poll_interval_ms=args.poll_interval_ms,
        ttl_ms=args.ttl_ms,
        conformance=args.conformance,
        hostile=args.hostile,
        require_token=args.require_token,
        get_delay_ms=max(0, args.get_delay_ms),
        update_delay_ms=max(0, args.update_delay_ms),
        list_delay_ms=max(0, args.list_delay_ms),
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(serve, config)


if __name__ == "__main__":
    main()
