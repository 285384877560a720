"""The bundled demo MCP server (taskhub.demo, unchanged) with a control surface, for bench/freshness.py and
bench/approval.py: it changes a task's status on command and timestamps when `tasks/update` arrives.

    python bench/demo_control_server.py --port 8791 --poll-interval-ms 1000 [--no-listen]

On top of the demo server as `python -m taskhub.demo --http` serves it (same engine, tools, `tasks/*`,
`subscriptions/listen` with `notifications/tasks`), in this process:

- the script `bench_hold`: a task that stays `working` ("held") until told to finish;
- `POST /bench/create?tool=bench_hold|approval&count=N`: N new tasks of that script, created on the engine
  directly (no tools/call): `{"tasks": [<DetailedTask>, ...]}`;
- `POST /bench/finish?task=ID`: the held task becomes `completed` now; the engine tells its watchers (the
  listen streams) at once, and a `tasks/get` from now on sees it. Answers `{"changedAt": <time.time()>}`,
  taken just before the change;
- `GET /bench/watched?task=ID`: `{"watched": true}` while a listen stream watches the task;
- `GET /bench/updates`: `{"<task id>": <time.time()>}`, when the HTTP request of the first `tasks/update`
  naming that task reached the ASGI application (its body's first chunk; before the SDK parses it);
- `GET /bench/next-poll?task=ID&after=T`: waits (up to 10 s) for a `tasks/get` of that task arriving after T
  (time.time()) and answers `{"at": <its arrival>}`, or `{"at": null}`; `GET /bench/polls`: every `tasks/get`
  arrival, `{"<task id>": [<time.time()>, ...]}`. So a benchmark can make a change at a chosen moment after a
  poll (the poll's phase, the same for every client), and tell the poll that saw it;
- `--no-listen`: `subscriptions/listen` is answered -32601 (a server that cannot push), so clients poll.

Times are `time.time()` of this machine, comparable with the browser's `Date.now()` and the benchmark's own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from taskhub.demo.scripts import SCRIPTS, Facts, Phase, completed
from taskhub.demo.server import DemoConfig, build_server, tcp_socket
from taskhub.demo.wire import WORKING

HOLD_TOOL = "bench_hold"
finish_times: dict[str, float] = {}


def hold_script(facts: Facts, now: float) -> Phase:
    finished_at = finish_times.get(facts.task_id)
    if finished_at is not None and now >= finished_at:
        return completed(finished_at, "released by the benchmark")
    return Phase(WORKING, facts.created_at, message="held by the benchmark")


SCRIPTS[HOLD_TOOL] = hold_script


class PollLog:
    """Every `tasks/get` arrival per task; `polled` is set (and replaced) at each."""

    def __init__(self) -> None:
        self.arrivals: dict[str, list[float]] = {}
        self.polled = anyio.Event()

    def add(self, task_id: str, arrived: float) -> None:
        self.arrivals.setdefault(task_id, []).append(arrived)
        self.polled.set()
        self.polled = anyio.Event()


class ArrivalClock:
    """ASGI wrapper: timestamps the first `tasks/update` of each task; answers listen -32601 if told to."""

    def __init__(self, app, *, listen: bool, updates: dict[str, float], polls: PollLog) -> None:
        self.app = app
        self.listen = listen
        self.updates = updates
        self.polls = polls

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/mcp":
            await self.app(scope, receive, send)
            return
        first = await receive()
        arrived = time.time()
        body = first.get("body", b"")
        read = (b'"tasks/update"', b'"tasks/get"') + (() if self.listen else (b'"subscriptions/listen"',))
        if any(method in body for method in read):
            while first.get("more_body"):  # the whole body, to read the task id (tiny requests: one chunk)
                more = await receive()
                first = {**first, "body": body + more.get("body", b""), "more_body": more.get("more_body", False)}
                body = first["body"]
            message = json.loads(body)
            if message.get("method") == "tasks/update":
                self.updates.setdefault(str(message.get("params", {}).get("taskId")), arrived)
            elif message.get("method") == "tasks/get":
                self.polls.add(str(message.get("params", {}).get("taskId")), arrived)
            elif message.get("method") == "subscriptions/listen":
                error = {"code": -32601, "message": "Method not found: subscriptions/listen"}
                await JSONResponse({"jsonrpc": "2.0", "id": message.get("id"), "error": error})(scope, receive, send)
                return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        await self.app(scope, replay, send)


def build(config: DemoConfig, *, listen: bool):
    demo = build_server(config)
    engine = demo.engine

    @demo.mcp.custom_route("/bench/create", methods=["POST"])
    async def create(request: Request) -> Response:
        tool = request.query_params.get("tool", HOLD_TOOL)
        count = int(request.query_params.get("count", "1"))
        args: dict[str, Any] = {"action": "benchmark"} if tool == "approval" else {}
        views = [engine.create(tool, args) for _ in range(count)]
        return JSONResponse({"tasks": [view.to_wire() for view in views]})

    @demo.mcp.custom_route("/bench/finish", methods=["POST"])
    async def finish(request: Request) -> Response:
        task_id = request.query_params["task"]
        changed_at = finish_times[task_id] = time.time()
        engine.refresh(task_id)  # records the phase and tells the listen streams, now
        return JSONResponse({"changedAt": changed_at})

    @demo.mcp.custom_route("/bench/watched", methods=["GET"])
    async def watched(request: Request) -> Response:
        return JSONResponse({"watched": bool(engine._watchers.get(request.query_params["task"]))})

    arrivals: dict[str, float] = {}
    polls = PollLog()

    @demo.mcp.custom_route("/bench/updates", methods=["GET"])
    async def updates(request: Request) -> Response:
        return JSONResponse(arrivals)

    @demo.mcp.custom_route("/bench/polls", methods=["GET"])
    async def all_polls(request: Request) -> Response:
        return JSONResponse(polls.arrivals)

    @demo.mcp.custom_route("/bench/next-poll", methods=["GET"])
    async def next_poll(request: Request) -> Response:
        task_id, after = request.query_params["task"], float(request.query_params["after"])
        with anyio.move_on_after(10):
            while not (seen := [at for at in polls.arrivals.get(task_id, []) if at > after]):
                await polls.polled.wait()
            return JSONResponse({"at": seen[0]})
        return JSONResponse({"at": None})

    app = demo.mcp.streamable_http_app(host=config.host)  # after the custom routes: it takes them as they are
    return demo, ArrivalClock(app, listen=listen, updates=arrivals, polls=polls)


async def serve(config: DemoConfig, *, listen: bool) -> None:
    demo, app = build(config, listen=listen)
    sock = tcp_socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(demo.engine.run_ticker)

            async def announce() -> None:
                while not server.started:
                    await anyio.sleep(0.02)
                port = sock.getsockname()[1]
                print(f"demo control server listening on http://{config.host}:{port}/mcp", flush=True)

            tasks.start_soon(announce)
            await server.serve(sockets=[sock])
            tasks.cancel_scope.cancel()
    finally:
        demo.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--poll-interval-ms", type=int, default=1000)
    parser.add_argument("--no-listen", action="store_true", help="answer subscriptions/listen with -32601")
    options = parser.parse_args()
    config = DemoConfig(
        transport="http", host=options.host, port=options.port, poll_interval_ms=options.poll_interval_ms
    )
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(lambda: serve(config, listen=not options.no_listen))


if __name__ == "__main__":
    main()
