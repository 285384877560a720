"""The bundled demo MCP server as a real subprocess, over HTTP or stdio, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from taskhub.mcp.client import HttpTarget, StdioTarget

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def demo_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def stdio_target(*options: str) -> StdioTarget:
    return StdioTarget(
        command=sys.executable,
        args=["-m", "taskhub.demo", "--stdio", *options],
        env={"PYTHONPATH": str(PROJECT_ROOT)},
        cwd=str(PROJECT_ROOT),
    )


class DemoServer:
    """`python -m taskhub.demo --http` on a fixed port, so that it can be stopped and started again."""

    def __init__(self, *options: str, port: int | None = None) -> None:
        self.options = options
        self.port = port or free_port()
        self.process: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    def _drain(self, stream) -> None:
        for line in stream:
            self.output.append(line)
            del self.output[:-200]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def target(self) -> HttpTarget:
        return HttpTarget(url=self.url)

    def start(self, timeout: float = 20) -> DemoServer:
        command = [sys.executable, "-m", "taskhub.demo", "--http", "--port", str(self.port), *self.options]
        self.process = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=demo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"demo server exited with {self.process.wait()} before it listened")
            self.output.append(line)
            if "listening on" in line:
                # Keep draining, or a chatty server would block on a full pipe.
                threading.Thread(target=self._drain, args=(self.process.stdout,), daemon=True).start()
                return self
        self.stop()
        raise RuntimeError("demo server did not say it was listening")

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
