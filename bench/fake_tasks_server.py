"""A fast fake ext-tasks MCP server for the tracker benchmark: every task is `working`, forever.

    python bench/fake_tasks_server.py --port 8790 --poll-interval-ms 1000

Raw asyncio HTTP/1.1 (keep-alive, pipelining-safe), no framework, so that the server is never the
bottleneck of what it measures. It answers:

- `POST /mcp` `tasks/get` for any task id: a `working` DetailedTask exactly in the wire format of the
  extension's schema (`GetTaskResult`: `resultType`, `taskId`, `status`, `createdAt`, `lastUpdatedAt`,
  `ttlMs` null, `pollIntervalMs` from the command line), and counts it;
- `server/discover` and `tools/list` (what the SDK client asks before anything else), `-32601` for any
  other method (so a tracker that tries `subscriptions/listen` falls back to polling), 202 for
  notifications;
- `GET /stats`: polls, distinct tasks seen, and for the measurement window the polls per second and the
  poll lateness (receive time minus due time, due = the task's previous poll + pollIntervalMs) p50/p90/p99/max;
- `POST /mark`: start a measurement window now (the previous poll of each task is kept as the base of
  its next lateness); `POST /clear`: forget everything (a new phase);
- `POST /groups` `{"ports": {"<client port>": "<group>"}}`: whose connections are whose (bench/tracker.py's
  scale-out mode names each poller process's ports); then `/stats` also says, per group, its polls, the tasks
  it polled and its lateness, and how many tasks more than one group polled in the window.

Every window also counts the early polls: a task polled again less than half its interval after its previous
poll, which is what two pollers following one task at the same time would do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from datetime import UTC, datetime

EXTENSION_ID = "io.modelcontextprotocol/tasks"
DISCOVER_RESULT = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}, "extensions": {EXTENSION_ID: {}}},
    "ttlMs": 0,
    "cacheScope": "private",
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "bench-fake-tasks", "version": "1"}},
}
TOOLS_RESULT = {"resultType": "complete", "tools": [], "ttlMs": 0, "cacheScope": "private"}


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


class State:
    def __init__(self, poll_interval_ms: int) -> None:
        self.poll_interval_ms = poll_interval_ms
        self.interval_s = poll_interval_ms / 1000
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        # Everything but the ids is constant: build the answer around them once.
        self.result_tail = (
            f',"status":"working","statusMessage":"benchmark task","createdAt":"{stamp}",'
            f'"lastUpdatedAt":"{stamp}","ttlMs":null,"pollIntervalMs":{poll_interval_ms}}}}}'
        ).encode()
        self.clear()

    def clear(self) -> None:
        self.polls = 0
        self.other_requests = 0
        self.last: dict[str, float] = {}
        self.groups: dict[int, str] = {}
        self.mark()

    def mark(self) -> None:
        self.window_start = time.monotonic()
        self.window_polls = 0
        self.early_polls = 0
        self.lateness: list[float] = []
        self.group_polls: dict[str, int] = {}
        self.group_lateness: dict[str, list[float]] = {}
        self.group_tasks: dict[str, set[str]] = {}

    def poll(self, task_id: str, port: int) -> None:
        now = time.monotonic()
        self.polls += 1
        self.window_polls += 1
        previous = self.last.get(task_id)
        self.last[task_id] = now
        group = self.groups.get(port, "other") if self.groups else None
        if group is not None:
            self.group_polls[group] = self.group_polls.get(group, 0) + 1
            self.group_tasks.setdefault(group, set()).add(task_id)
        if previous is not None:
            # A gap belongs to the window its second poll falls in (its first may be just before it).
            gap = now - previous - self.interval_s
            self.lateness.append(gap)
            if now - previous < self.interval_s / 2:
                self.early_polls += 1
            if group is not None:
                self.group_lateness.setdefault(group, []).append(gap)

    def stats(self) -> dict:
        seconds = time.monotonic() - self.window_start
        groups = {}
        for group, polls in self.group_polls.items():
            tasks = self.group_tasks[group]
            groups[group] = {
                "polls": polls,
                "tasks": len(tasks),
                "lateness_ms": lateness_ms(self.group_lateness.get(group, [])),
            }
        by_more_than_one = 0
        if len(self.group_tasks) > 1:
            seen: set[str] = set()
            for tasks in self.group_tasks.values():
                by_more_than_one += len(seen & tasks)
                seen |= tasks
        return {
            "poll_interval_ms": self.poll_interval_ms,
            "polls_total": self.polls,
            "other_requests": self.other_requests,
            "distinct_tasks": len(self.last),
            "window": {
                "seconds": round(seconds, 3),
                "polls": self.window_polls,
                "polls_per_second": round(self.window_polls / seconds, 1) if seconds > 0 else None,
                "gaps": len(self.lateness),
                "lateness_ms": lateness_ms(self.lateness),
                "early_polls": self.early_polls,
                "groups": groups,
                "tasks_polled_by_more_than_one_group": by_more_than_one,
            },
        }


def lateness_ms(values: list[float]) -> dict:
    late = sorted(values)
    return {
        name: (None if value is None else round(value * 1000, 1))
        for name, value in (
            ("p50", percentile(late, 0.50)),
            ("p90", percentile(late, 0.90)),
            ("p99", percentile(late, 0.99)),
            ("max", late[-1] if late else None),
            ("min", late[0] if late else None),
        )
    }


class HttpProtocol(asyncio.Protocol):
    def __init__(self, state: State) -> None:
        self.state = state
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.port = 0

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.port = peer[1] if peer else 0

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip())
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            status, content_type, payload = self.handle(method, path, body)
            self.respond(status, content_type, payload, close)
            if close:
                return

    def respond(self, status: str, content_type: str, payload: bytes, close: bool) -> None:
        assert self.transport is not None
        head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(payload)}\r\n"
        if close:
            head += "connection: close\r\n"
        self.transport.write(head.encode() + b"\r\n" + payload)
        if close:
            self.transport.close()

    def handle(self, method: str, path: str, body: bytes) -> tuple[str, str, bytes]:
        state = self.state
        if method == "POST" and path == "/mcp":
            message = json.loads(body)
            rpc_method = message.get("method")
            if rpc_method == "tasks/get":
                task_id = message["params"]["taskId"]
                state.poll(task_id, self.port)
                head = f'{{"jsonrpc":"2.0","id":{json.dumps(message["id"])},"result":{{"resultType":"complete"'
                head += f',"taskId":{json.dumps(task_id)}'
                return "200 OK", "application/json", head.encode() + state.result_tail
            state.other_requests += 1
            if "id" not in message:
                return "202 Accepted", "application/json", b""
            if rpc_method == "server/discover":
                answer = {"result": DISCOVER_RESULT}
            elif rpc_method == "tools/list":
                answer = {"result": TOOLS_RESULT}
            else:
                answer = {"error": {"code": -32601, "message": f"Method not found: {rpc_method}"}}
            return "200 OK", "application/json", json.dumps({"jsonrpc": "2.0", "id": message["id"], **answer}).encode()
        if method == "GET" and path.startswith("/stats"):
            return "200 OK", "application/json", json.dumps(state.stats()).encode()
        if method == "POST" and path == "/mark":
            state.mark()
            return "200 OK", "application/json", b"{}"
        if method == "POST" and path == "/groups":
            state.groups = {int(port): str(group) for port, group in json.loads(body)["ports"].items()}
            return "200 OK", "application/json", b"{}"
        if method == "POST" and path == "/clear":
            state.clear()
            return "200 OK", "application/json", b"{}"
        if path == "/mcp":
            return "405 Method Not Allowed", "text/plain", b""
        return "404 Not Found", "text/plain", b""


async def serve(host: str, port: int, poll_interval_ms: int) -> None:
    state = State(poll_interval_ms)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HttpProtocol(state), host, port, backlog=1024, reuse_address=True)
    where = f"http://{host}:{port}/mcp"
    print(f"fake tasks server on {where} pid {os.getpid()} pollIntervalMs {poll_interval_ms}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--poll-interval-ms", type=int, default=1000)
    options = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(options.host, options.port, options.poll_interval_ms))


if __name__ == "__main__":
    main()
