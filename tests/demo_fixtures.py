"""Raw JSON-RPC access to the demo server (taskhub/demo), over HTTP (to a demo_process.DemoServer) and stdio.

These helpers speak the wire directly (httpx2 and pipes), not through an MCP client, so the server tests
check exactly what the server sends. Results are validated against the vendored extension schema.
"""

from __future__ import annotations

import itertools
import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from jsonschema import Draft202012Validator

from tests.demo_process import PROJECT_ROOT, demo_command

SCHEMA = json.loads((Path(__file__).parent / "spec" / "schema.json").read_text())
TASKS = "io.modelcontextprotocol/tasks"
PROTOCOL_VERSION = "2026-07-28"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
FULL_CAPABILITIES = {"elicitation": {"form": {}, "url": {}}, "extensions": {TASKS: {}}}


def meta(capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": FULL_CAPABILITIES if capabilities is None else capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "taskhub-demo-tests", "version": "0"},
    }


_validators: dict[str, Draft202012Validator] = {}


def schema_errors(definition: str, instance: Any) -> list[str]:
    """Messages of every violation of `$defs/<definition>` in the vendored schema (empty when valid)."""
    if definition not in _validators:
        root = {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{definition}"}
        _validators[definition] = Draft202012Validator(root)
    return [f"{list(error.absolute_path)}: {error.message}" for error in _validators[definition].iter_errors(instance)]


def assert_valid(definition: str, instance: Any) -> None:
    errors = schema_errors(definition, instance)
    assert not errors, f"not a valid {definition}: {errors}\n{json.dumps(instance, indent=2)}"


class RpcError(Exception):
    def __init__(self, error: dict[str, Any], status: int | None = None) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")
        self.message = error.get("message")
        self.data = error.get("data")
        self.status = status


@dataclass
class Reply:
    status: int | None  # HTTP status; None on stdio
    body: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)  # notifications before the reply

    @property
    def result(self) -> dict[str, Any]:
        if "error" in self.body:
            raise RpcError(self.body["error"], self.status)
        return self.body["result"]

    @property
    def error(self) -> dict[str, Any]:
        assert "error" in self.body, f"expected an error, got {self.body}"
        return self.body["error"]


class RawClient:
    """Anything that can send one JSON-RPC request and return the reply (plus notifications on its stream)."""

    _ids = itertools.count(1)

    def send(self, message: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
        raise NotImplementedError

    def request(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        capabilities: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        body = {**(params or {}), "_meta": meta(capabilities)}
        return self.send({"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": body}, headers)

    def call(self, method: str, params: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
        return self.request(method, params, **options).result

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
        return self.call("tools/call", {"name": name, "arguments": arguments or {}}, **options)

    def get(self, task_id: str) -> dict[str, Any]:
        return self.call("tasks/get", {"taskId": task_id})

    def wait_for(self, task_id: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            task = self.get(task_id)
            if predicate(task):
                return task
            assert time.monotonic() < deadline, f"task never got there; last seen {task}"
            time.sleep(0.05)

    def wait_for_status(self, task_id: str, *statuses: str, timeout: float = 10) -> dict[str, Any]:
        return self.wait_for(task_id, lambda task: task["status"] in statuses, timeout)


def standard_headers(message: dict[str, Any]) -> dict[str, str]:
    """What a conforming client sends: Accept, protocol version, Mcp-Method, and Mcp-Name where one applies."""
    method, params = message["method"], message.get("params") or {}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL_VERSION,
        "Mcp-Method": method,
    }
    name = params.get("taskId") if method in TASK_METHODS else params.get("name") if method == "tools/call" else None
    if isinstance(name, str):
        headers["Mcp-Name"] = name
    return headers


def parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data:"):
            yield json.loads(line[len("data:") :].strip())


class HttpClient(RawClient):
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx2.Client(timeout=30)

    def send(self, message: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
        sent_headers = {**standard_headers(message), **(headers or {})}
        sent_headers = {key: value for key, value in sent_headers.items() if value is not None}
        with self.http.stream("POST", self.url, json=message, headers=sent_headers) as response:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                events = list(parse_sse(response.iter_lines()))
                return Reply(response.status_code, events[-1], events[:-1])
            response.read()
            return Reply(response.status_code, response.json())

    def listen(self, task_ids: list[Any], *, capabilities: dict[str, Any] | None = None) -> Reply:
        """A task subscription; returns once the server ends the stream (every task terminal)."""
        return self.request("subscriptions/listen", {"notifications": {"taskIds": task_ids}}, capabilities=capabilities)

    def stats(self) -> dict[str, Any]:
        return self.http.get(self.url.removesuffix("/mcp") + "/demo/stats").json()

    def close(self) -> None:
        self.http.close()


class StdioClient(RawClient):
    """The demo server over stdio: one JSON message per line, replies matched by id, notifications kept."""

    def __init__(self, *options: str) -> None:
        self.process = subprocess.Popen(
            demo_command("stdio", *options),
            cwd=PROJECT_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.incoming: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.incoming.put(json.loads(line))

    def write(self, message: dict[str, Any]) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def next_message(self, timeout: float = 10) -> dict[str, Any]:
        return self.incoming.get(timeout=timeout)

    def send(self, message: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
        self.write(message)
        events = []
        while True:
            received = self.next_message()
            if received.get("id") == message["id"] and "method" not in received:
                return Reply(None, received, events)
            events.append(received)

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
