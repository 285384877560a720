"""The bundled demo MCP server as a real subprocess, over HTTP or stdio, for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskhub.mcp.client import HttpTarget, StdioTarget
from tests.helpers import free_port  # noqa: F401 - imported from here by tests/browser
from tests.process_output import OutputLines

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def demo_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def demo_command(transport: str, *options: str) -> list[str]:
    """`python -m taskhub.demo --http|--stdio ...`: the one way the tests start the demo server."""
    return [sys.executable, "-m", "taskhub.demo", f"--{transport}", *options]


def stdio_target(*options: str) -> StdioTarget:
    """What taskhub's own client starts for a stdio server: the demo server over stdio."""
    command, *args = demo_command("stdio", *options)
    return StdioTarget(command=command, args=args, env={"PYTHONPATH": str(PROJECT_ROOT)}, cwd=str(PROJECT_ROOT))


class DemoServer:
    """`python -m taskhub.demo --http` as a subprocess. The port is the one it first listened on (any free one
    unless given), so that it can be stopped and started again at the same URL. Its output (stderr merged) is
    read all along, so a chatty server never blocks on a full pipe, and is shown when it fails to start."""

    def __init__(self, *options: str, port: int | None = None) -> None:
        self.options = options
        self.port = port or 0
        self.process: subprocess.Popen[str] | None = None
        self.output: OutputLines | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def target(self) -> HttpTarget:
        return HttpTarget(url=self.url)

    def start(self, timeout: float = 30) -> DemoServer:
        command = demo_command("http", "--port", str(self.port), *self.options)
        self.process = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=demo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.output = OutputLines(self.process)
        try:
            announce = self.output.wait_for("listening on http://", timeout)
        except AssertionError:
            self.kill()
            raise
        self.port = int(announce.split()[-1].removesuffix("/mcp").rsplit(":", 1)[1])
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Stop it the hard way, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def __enter__(self) -> DemoServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# Loaded as a plugin by conftest.py. Test modules that need only *a* demo server share one per session: each test
# uses tasks of its own (the server's task ids are unique, its stats are counted per task), and none stops it.


@pytest.fixture(scope="session")
def shared_demo_server() -> Iterator[DemoServer]:
    """The demo server with fast polls (every 100 ms)."""
    with DemoServer("--poll-interval-ms", "100") as server:
        yield server


@pytest.fixture(scope="session")
def shared_demo_server_requiring_token() -> Iterator[DemoServer]:
    """The demo server that refuses every request without the bearer token "s3cret"."""
    with DemoServer("--require-token", "s3cret") as server:
        yield server
