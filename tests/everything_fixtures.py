"""The official reference MCP server, @modelcontextprotocol/server-everything, for the tests that drive it through the
whole stack (classic elicitation and the other features of the 2025 revisions): installed once per test session by
scripts/server_everything.sh (a pinned version, with the machine's Node.js and npm), over stdio or Streamable HTTP."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskhub.servers.discovery import discover_and_record
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from tests.helpers import free_port, wait_until
from tests.stack_fixtures import in_own_thread

PROJECT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def everything() -> str:
    """The path of the reference server's entry point, installed once."""
    installed = subprocess.run(
        [str(PROJECT_DIR / "scripts" / "server_everything.sh")], capture_output=True, text=True, timeout=600
    )
    assert installed.returncode == 0, installed.stderr
    return installed.stdout.strip()


@pytest.fixture
def over_http(everything) -> Iterator[str]:
    """The reference server over Streamable HTTP on a free port: its endpoint's URL."""
    port = free_port()
    (PROJECT_DIR / "test-output").mkdir(exist_ok=True)
    with open(PROJECT_DIR / "test-output" / f"server-everything-{port}.log", "w") as log:
        server = subprocess.Popen(
            [shutil.which("node") or "node", everything, "streamableHttp"],
            env={**os.environ, "PORT": str(port)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: port_open(port) or server.poll() is not None, timeout=30, what="server-everything listening")
        assert server.poll() is None, f"server-everything exited with {server.returncode}"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(10)


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def register_everything(admin, everything: str, *, url: str | None = None, expect_tool: str) -> Server:
    """The reference server registered (over Streamable HTTP at `url`, else over stdio) and discovered in this
    process; `expect_tool` must be among its tools (they depend on the client capabilities taskhub declares)."""
    if url is not None:
        server = create_server(name="everything over http", transport="http", url=url, user=admin)
    else:
        command = shutil.which("node") or "node"
        server = create_server(
            name="everything over stdio", transport="stdio", command=command, args=[everything, "stdio"], user=admin
        )
    in_own_thread(discover_and_record, server=server, user=admin)
    server.refresh_from_db()
    assert expect_tool in {tool["name"] for tool in server.tools}, server.last_error
    return server


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m taskhub.mcp ARGS…`, run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "taskhub.mcp", *args], capture_output=True, text=True, timeout=120, cwd=PROJECT_DIR
    )
