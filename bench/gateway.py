"""Gateway polling: `tasks/get` throughput and latency through taskhub's MCP gateway (`/mcp/servers/<name>`,
answered from Postgres) against the same `tasks/get` sent straight to the demo server, in the same run.

The stack in real processes (bench/livestack.py): a database of the benchmark's own (dropped and created), daphne
and one `manage.py worker`, the bundled demo server (`python -m taskhub.demo --http`, polled by the worker every
`--upstream-poll-ms`). `--tasks` tasks of the demo's `long` tool are launched through the gateway (`tools/call` with
an API token of an operator). Then, for each path, `--requests` `tasks/get` spread over those tasks, `--concurrency`
at a time, on one aiohttp session with hand-built JSON (the same body and routing headers for both paths; the
gateway's also carry the bearer token): requests per second over the whole batch, and per-request latency (p50,
p95, max) from send to the whole answer read. The two paths alternate `--rounds` times, so load drifts hit both.
What differs: the gateway is Django (token lookup, one task read, the wire mapping) on daphne; the demo server is
the SDK's Streamable HTTP app on uvicorn with an in-process task store.

    uv run python bench/gateway.py                               # 4 rounds of 2,000 requests per path (~2 min)
    uv run python bench/gateway.py --requests 200 --no-record    # a quick look

Postgres: --database-url (default $BENCH_GATEWAY_DATABASE_URL or
postgres://postgres@127.0.0.1:5432/taskhub_bench_gateway), dropped and created by the benchmark.
Redis: --redis-url (default redis://127.0.0.1:6379/0). Results are appended to bench/RESULTS.md unless --no-record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

import aiohttp
from livestack import ROOT, append_results, drop, load, ms, prepare, results_header, say, spread, web_and_worker

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench_gateway"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
}


def body(method: str, params: dict, request_id: int) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": META}}
    ).encode()


def routing(method: str, name: str | None = None) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


async def launch(session: aiohttp.ClientSession, url: str, count: int) -> list[str]:
    """`count` tasks of the demo's `long` tool through the gateway: their taskhub ids."""
    ids = []
    for n in range(count):
        payload = body("tools/call", {"name": "long", "arguments": {"seconds": 3600}}, n)
        async with session.post(url, data=payload, headers=routing("tools/call", "long")) as response:
            answer = await response.json()
        if answer.get("result", {}).get("resultType") != "task":
            raise SystemExit(f"tools/call through the gateway did not answer with a task: {answer}")
        ids.append(answer["result"]["taskId"])
    return ids


async def poll_batch(
    session: aiohttp.ClientSession, url: str, task_ids: list[str], requests: int, concurrency: int
) -> tuple[float, list[float]]:
    """(requests per second, latencies in ms) of `requests` tasks/get spread over `task_ids`."""
    latencies: list[float] = []
    next_request = iter(range(requests))

    async def client() -> None:
        for n in next_request:
            task_id = task_ids[n % len(task_ids)]
            started = time.perf_counter()
            async with session.post(
                url, data=body("tasks/get", {"taskId": task_id}, n), headers=routing("tasks/get", task_id)
            ) as response:
                answer = await response.read()
            latencies.append(ms(time.perf_counter() - started))
            if response.status != 200 or b'"result"' not in answer:
                raise SystemExit(f"tasks/get failed ({response.status}): {answer[:300]!r}")

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return requests / (time.perf_counter() - started), latencies


async def measure(args, gateway_url: str, demo_url: str, token: str, remote_of: dict[str, str]) -> dict:
    connector = aiohttp.TCPConnector(limit=args.concurrency * 2)
    results: dict[str, dict[str, list[float]]] = {"gateway": {"rates": [], "ms": []}, "demo": {"rates": [], "ms": []}}
    async with aiohttp.ClientSession(connector=connector) as session:
        gateway_ids = list(remote_of)
        demo_ids = list(remote_of.values())
        for round_number in range(1, args.rounds + 1):
            for path, url, ids, headers in (
                ("gateway", gateway_url, gateway_ids, {"Authorization": f"Bearer {token}"}),
                ("demo", demo_url, demo_ids, {}),
            ):
                session.headers.clear()
                session.headers.update(headers)
                rate, latencies = await poll_batch(session, url, ids, args.requests, args.concurrency)
                results[path]["rates"].append(rate)
                results[path]["ms"].extend(latencies)
                median = spread(latencies)["p50"]
                say(f"round {round_number} {path}: {rate:,.0f} tasks/get per second, p50 {median:.1f} ms")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--requests", type=int, default=2000, help="tasks/get per path per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--upstream-poll-ms", type=int, default=10_000, help="the worker's own polling of each task")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_GATEWAY_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    load_start = load()
    env = prepare(args.database_url, args.redis_url, f"benchgateway{os.getpid()}")
    from account_fixtures import make_user
    from demo_process import DemoServer
    from stack_fixtures import register_and_discover

    from taskhub.accounts.groups import ADMINS
    from taskhub.api.tokens import create_token
    from taskhub.tasks.models import Task

    try:
        with (
            DemoServer("--poll-interval-ms", str(args.upstream_poll_ms)) as demo,
            web_and_worker(env, f"bench-gateway-{os.getpid()}") as (web, _worker),
        ):
            agent = make_user(f"agent-{uuid.uuid4().hex[:6]}", ADMINS)
            server = register_and_discover(demo, agent, name="demo")
            _, token = create_token(user=agent, name="bench")
            gateway_url = f"{web.url}/mcp/servers/{server.name}"

            async def launch_all() -> list[str]:
                async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
                    return await launch(session, gateway_url, args.tasks)

            say(f"launching {args.tasks} tasks through the gateway")
            task_ids = asyncio.run(launch_all())
            deadline = time.monotonic() + 120
            while Task.objects.filter(pk__in=task_ids, remote_task_id__isnull=True).exists():
                if time.monotonic() > deadline:
                    raise SystemExit("the worker did not launch every task within 120 s")
                time.sleep(0.2)
            remote_of = dict(Task.objects.filter(pk__in=task_ids).values_list("id", "remote_task_id"))
            remote_of = {str(task_id): remote for task_id, remote in remote_of.items()}
            results = asyncio.run(measure(args, gateway_url, demo.url, token, remote_of))
    finally:
        drop(args.database_url)
    report(args, results, load_start)


def report(args, results: dict, load_start: str) -> None:
    command = " ".join(["uv run python bench/gateway.py", *sys.argv[1:]])
    lines = [
        *results_header("Gateway: tasks/get through taskhub vs the demo server's own", command, load_start),
        f"- {args.tasks} tasks, {args.rounds} rounds of {args.requests} tasks/get per path, {args.concurrency} at a "
        "time, alternating",
        "",
        "| path | tasks/get per s (median of rounds) | p50 ms | p95 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for path, label in (("gateway", "gateway (/mcp/servers/demo, Postgres)"), ("demo", "demo server directly")):
        rates = sorted(results[path]["rates"])
        spreads = spread(results[path]["ms"])
        lines.append(
            f"| {label} | {rates[len(rates) // 2]:,.0f} | {spreads['p50']:.1f} | {spreads['p95']:.1f} | "
            f"{spreads['max']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_record:
        append_results(ROOT / "bench" / "RESULTS.md", text)


if __name__ == "__main__":
    main()
