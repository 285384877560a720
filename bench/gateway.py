"""Gateway polling: `tasks/get` throughput and latency through taskhub's MCP gateway (`/mcp/servers/<name>`,
answered from Postgres) against the same `tasks/get` sent straight to the demo server, in the same run.

The stack in real processes (bench/livestack.py): a database of the benchmark's own (dropped and created), daphne
and one `manage.py worker`, the bundled demo server (`python -m taskhub.demo --http`, polled by the worker every
`--upstream-poll-ms`). `--tasks` tasks of the demo's `progress` tool, one ten-minute step (nothing changes while
they are polled, so the worker following them is idle), are launched through the gateway (`tools/call` with an API
token of an operator). Then, for each path, `--requests` `tasks/get` spread over those tasks, `--concurrency`
at a time, on one aiohttp session with hand-built JSON (the same body and routing headers for both paths; the
gateway's also carry the bearer token): requests per second over the whole batch, per-request latency (p50,
p95, max) from send to the whole answer read, and the CPU the serving process (daphne; the demo server) spent per
request. The two paths alternate `--rounds` times, so load drifts hit both. Then `--calls` `tools/call` of the
demo's `quick` tool (an echo) one at a time on each path, alternating: what the gateway adds to a quick call, as it
sends the call itself (taskhub/gateway/sending.py; the tasks launched before connected its client) and, on a second
daphne with TASKHUB_GATEWAY_SENDS_CALLS=0, as the worker sends it; with where the time goes (the launch's audit rows)
and which process sent each call. With `--baseline-tree DIR` (below), the gateway of that checkout joins the calls'
alternation on a daphne of its own, and the two gateways' figures are compared call by call in the same run:

    git worktree add /tmp/taskhub-before HEAD~1
    uv run python bench/gateway.py --requests 20 --rounds 1 --calls 400 --baseline-tree /tmp/taskhub-before

What differs: the gateway is taskhub on daphne (a plain `tasks/get` answered from one prepared statement joining the
token, its user and the task, outside Django's handler: taskhub/gateway/direct.py; the wire mapping); the demo server
is the SDK's Streamable HTTP app on uvicorn with an in-process task store. A third path in the same rounds, "daphne
alone": a second daphne serving bench/daphne_floor.py, a bare ASGI application that answers every request with the
same JSON of the gateway's answer's size, without Django or a database: the most one daphne serves, which bounds
what the gateway can reach on one (issue 37 item 1 asks >= 0.8x the demo server on one daphne).

    uv run python bench/gateway.py                               # 4 rounds of 2,000 requests per path (~2 min)
    uv run python bench/gateway.py --requests 200 --no-record    # a quick look

`--listen`: idle `subscriptions/listen` streams instead (issue 30 item 6, issue 31 item 1). The same stack; `--tasks`
tasks of the demo's `progress` tool launched (one ten-minute step: nothing changes while they are listened to);
`--streams` streams opened through the gateway (spread over the tasks, one API token per 20 streams,
TASKHUB_GATEWAY_STREAMS_PER_TOKEN's default) and held `--hold` seconds, with nothing changing. Over that window:
the database's transactions per second (pg_stat_database xact_commit + xact_rollback of the benchmark's database:
every statement outside a transaction is one, so it counts each read a stream makes, and it needs no extension;
the worker's own background work is in it too, so the same window is measured first with no stream open, and
that row is the floor), daphne's CPU (utime + stime from /proc, % of one core), its threads and the database's
connections (pg_stat_activity), and daphne's resident memory (VmRSS; KB per idle stream, issue 37 item 4's
goal ≤ 30 KB). Then the latency of a change reaching a listening agent: `--changes` times, the
benchmark process commits a new statusMessage on a listened task (services.apply_snapshot; the publish goes
through Redis as a worker's does) and times until that stream delivers it (p50, p95). With `--baseline-tree DIR`
(a checkout of the implementation before, e.g. `git worktree add /tmp/taskhub-before ef93752`), a second daphne is
run from DIR on the same database and Redis, and every figure is measured against it too, in the same run:

    git worktree add /tmp/taskhub-before ef93752
    uv run python bench/gateway.py --listen --streams 500 --hold 60 --baseline-tree /tmp/taskhub-before
    uv run python bench/gateway.py --listen --streams 20 --hold 5 --changes 10 --no-record   # a smoke run

Postgres: --database-url (default $BENCH_GATEWAY_DATABASE_URL or
postgres://postgres@127.0.0.1:5432/taskhub_bench_gateway), dropped and created by the benchmark.
Redis: --redis-url (default redis://127.0.0.1:6379/0). Results are appended to bench/RESULTS.md unless --no-record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import sys
import time
import uuid
from pathlib import Path

import aiohttp
from livestack import (
    PROCESS_SETTINGS,
    ROOT,
    append_results,
    drop,
    load,
    ms,
    prepare,
    profiled,
    results_header,
    say,
    spread,
    web_and_worker,
)

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


async def launch(
    session: aiohttp.ClientSession, url: str, count: int, tool: str = "long", arguments: dict | None = None
) -> list[str]:
    """`count` tasks of a demo tool (`long`, an hour) through the gateway: their taskhub ids."""
    ids = []
    for n in range(count):
        call = {"name": tool, "arguments": arguments or {"seconds": 3600}}
        async with session.post(url, data=body("tools/call", call, n), headers=routing("tools/call", tool)) as response:
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


async def measure(
    args,
    gateway_url: str,
    demo_url: str,
    floor_url: str,
    call_urls: dict[str, str],
    token: str,
    remote_of: dict[str, str],
    pids: dict[str, int],
) -> dict:
    """Per path: each round's rate, every latency, and the CPU its server process spent per request (utime + stime
    of daphne or of the demo server over the round, over its requests: less moved by other load than the rate)."""
    connector = aiohttp.TCPConnector(limit=args.concurrency * 2)
    results: dict[str, dict[str, list[float]]] = {
        path: {"rates": [], "ms": [], "cpu_ms": []} for path in ("gateway", "demo", "floor")
    }
    async with aiohttp.ClientSession(connector=connector) as session:
        gateway_ids = list(remote_of)
        demo_ids = list(remote_of.values())
        for round_number in range(1, args.rounds + 1):
            for path, url, ids, headers in (
                ("gateway", gateway_url, gateway_ids, {"Authorization": f"Bearer {token}"}),
                ("demo", demo_url, demo_ids, {}),
                ("floor", floor_url, gateway_ids, {"Authorization": f"Bearer {token}"}),
            ):
                session.headers.clear()
                session.headers.update(headers)
                cpu_before = cpu_seconds(pids[path])
                rate, latencies = await poll_batch(session, url, ids, args.requests, args.concurrency)
                results[path]["cpu_ms"].append(ms(cpu_seconds(pids[path]) - cpu_before) / args.requests)
                results[path]["rates"].append(rate)
                results[path]["ms"].extend(latencies)
                median = spread(latencies)["p50"]
                say(
                    f"round {round_number} {path}: {rate:,.0f} tasks/get per second, p50 {median:.1f} ms, "
                    f"{results[path]['cpu_ms'][-1]:.2f} ms of its server's CPU per request"
                )
        results["calls"] = await quick_calls(session, call_urls, token, args.calls)
    return results


# The quick calls' paths: the gateway sending the call itself (taskhub/gateway/sending.py), the same gateway on a
# daphne with TASKHUB_GATEWAY_SENDS_CALLS=0 (the worker sends it, as before), and the demo server called directly;
# with --baseline-tree, the gateway of that checkout too, on a daphne of its own (gateway_before).
CALL_PATHS = ("gateway", "gateway_before", "gateway_by_worker", "demo")


async def quick_calls(session: aiohttp.ClientSession, urls: dict[str, str], token: str, count: int) -> dict:
    """`count` `tools/call` of the demo's `quick` tool (an echo, never a task) one at a time on each path of `urls`,
    the paths alternating (this gateway and the one before swap places every call, so neither always follows the
    other): each one's ms from send to the whole answer read, and for the gateway's paths when it was sent and
    answered (wall clock, for the steps read off the audit rows). The arguments name the path: `<path> <n>`."""
    paths = [path for path in CALL_PATHS if path in urls]
    latencies: dict[str, list[float]] = {path: [] for path in paths}
    moments: dict[str, list[tuple[float, float]]] = {path: [] for path in paths}
    agent = {"Authorization": f"Bearer {token}"}
    for n in range(count):
        order = paths if n % 2 == 0 or "gateway_before" not in urls else [paths[1], paths[0], *paths[2:]]
        for path in order:
            text = f"{path} {n}"
            call = {"name": "quick", "arguments": {"text": text}}
            headers = {} if path == "demo" else agent
            sent_at, started = time.time(), time.perf_counter()
            async with session.post(
                urls[path], data=body("tools/call", call, n), headers={**routing("tools/call", "quick"), **headers}
            ) as response:
                answer = await response.read()
            latencies[path].append(ms(time.perf_counter() - started))
            moments[path].append((sent_at, time.time()))
            if response.status != 200 or f"echo: {text}".encode() not in answer:
                raise SystemExit(f"tools/call quick through {path} failed ({response.status}): {answer[:300]!r}")
    if count:
        say("tools/call quick, p50: " + ", ".join(f"{path} {spread(latencies[path])['p50']:.1f} ms" for path in paths))
    return {**latencies, "moments": moments}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--requests", type=int, default=2000, help="tasks/get per path per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=100, help="quick tools/call per path, one at a time")
    parser.add_argument("--upstream-poll-ms", type=int, default=10_000, help="the worker's own polling of each task")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_GATEWAY_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument(
        "--profile",
        default="",
        help="py-spy daphne and the worker while measuring: PREFIX-daphne.txt, PREFIX-worker.txt",
    )
    parser.add_argument("--listen", action="store_true", help="idle subscriptions/listen streams (module docstring)")
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--hold", type=float, default=60.0, help="seconds each window lasts")
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--baseline-tree", help="a checkout of the implementation before, served by a second daphne")
    args = parser.parse_args()
    if args.listen:
        listen_main(args)
        return
    load_start = load()
    env = prepare(args.database_url, args.redis_url, f"benchgateway{os.getpid()}")
    from account_fixtures import make_user
    from browser_fixtures import running_daphne
    from demo_process import DemoServer
    from stack_fixtures import register_and_discover

    from taskhub.accounts.groups import ADMINS
    from taskhub.api.tokens import create_token
    from taskhub.tasks.models import Task

    try:
        with (
            DemoServer("--poll-interval-ms", str(args.upstream_poll_ms)) as demo,
            web_and_worker(env, f"bench-gateway-{os.getpid()}") as (web, worker),
            running_daphne(**{key: env[key] for key in PROCESS_SETTINGS}, TASKHUB_GATEWAY_SENDS_CALLS="0") as by_worker,
            daphne_alone() as floor,
            contextlib.ExitStack() as optional,
        ):
            before = None
            if args.baseline_tree:
                before = optional.enter_context(daphne_from(Path(args.baseline_tree), env, label="before"))
            agent = make_user(f"agent-{uuid.uuid4().hex[:6]}", ADMINS)
            server = register_and_discover(demo, agent, name="demo")
            _, token = create_token(user=agent, name="bench")
            gateway_url = f"{web.url}/mcp/servers/{server.name}"

            # Tasks that change nothing while polled (one ten-minute step): the worker following them stays idle.
            task_ids = launched_through_the_gateway(gateway_url, token, args.tasks, "progress", QUIET_TASK)
            remote_of = dict(Task.objects.filter(pk__in=task_ids).values_list("id", "remote_task_id"))
            remote_of = {str(task_id): remote for task_id, remote in remote_of.items()}
            with profiled({"daphne": web.process.pid, "worker": worker.pid}, args.profile):
                pids = {"gateway": web.process.pid, "demo": demo.process.pid, "floor": floor.process.pid}
                floor_url = f"{floor.url}/mcp/servers/{server.name}"
                call_urls = {
                    "gateway": gateway_url,
                    "gateway_by_worker": f"{by_worker.url}/mcp/servers/{server.name}",
                    "demo": demo.url,
                }
                if before is not None:
                    call_urls["gateway_before"] = f"{before.url}/mcp/servers/{server.name}"
                results = asyncio.run(
                    measure(args, gateway_url, demo.url, floor_url, call_urls, token, remote_of, pids)
                )
            results["call_steps"] = {
                path: call_steps(results["calls"], path) for path in call_urls if path.startswith("gateway")
            }
    finally:
        drop(args.database_url)
    report(args, results, load_start)


def launched_through_the_gateway(url: str, token: str, count: int, *tool_and_arguments) -> list[str]:
    """`count` tasks launched through the gateway at `url` (launch()), once the worker has launched each upstream."""
    from taskhub.tasks.models import Task

    async def launch_all() -> list[str]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
            return await launch(session, url, count, *tool_and_arguments)

    say(f"launching {count} tasks through the gateway")
    task_ids = asyncio.run(launch_all())
    deadline = time.monotonic() + 120
    while Task.objects.filter(pk__in=task_ids, remote_task_id__isnull=True).exists():
        if time.monotonic() > deadline:
            raise SystemExit("the worker did not launch every task within 120 s")
        time.sleep(0.2)
    return task_ids


CALL_STEPS = (
    ("sent → the launch recorded (task.launched)", None, "task.launched"),
    ("→ marked sent (task.launch_sent)", "task.launched", "task.launch_sent"),
    ("→ the server's answer recorded (task.launch_answered)", "task.launch_sent", "task.launch_answered"),
    ("→ the answer read by the agent", "task.launch_answered", None),
)


def call_steps(calls: dict, path: str) -> tuple[list[tuple[str, float]], dict[str, int]]:
    """Where a quick call's time goes on one of the gateway's paths: p50 ms of each step between the agent's send,
    the audit rows of its launch (their clocks are the database's, on this machine) and the answer read; and how many
    of the calls each process sent (the `task.launch_sent` row's actor: gateway or worker)."""
    from taskhub.audit.models import AuditEvent
    from taskhub.tasks.models import Task

    sent_and_answered = calls["moments"][path]
    if not sent_and_answered:
        return [], {}
    task_of = {
        arguments["text"]: task_id
        for task_id, arguments in Task.objects.filter(tool="quick", arguments__text__startswith=f"{path} ").values_list(
            "pk", "arguments"
        )
    }
    tasks = [task_of.get(f"{path} {n}") for n in range(len(sent_and_answered))]
    times: dict = {}
    senders: dict[str, int] = {}
    for task_id, action, at, actor in AuditEvent.objects.filter(
        task_id__in=[task for task in tasks if task is not None],
        action__in=["task.launched", "task.launch_sent", "task.launch_answered"],
    ).values_list("task_id", "action", "time", "actor_label"):
        times.setdefault(task_id, {})[action] = at.timestamp()
        if action == "task.launch_sent":
            senders[actor] = senders.get(actor, 0) + 1
    steps: dict[str, list[float]] = {label: [] for label, _, _ in CALL_STEPS}
    for task_id, (sent_at, answered_at) in zip(tasks, sent_and_answered, strict=True):
        moments = {None: sent_at, **times.get(task_id, {})}
        for label, start, end in CALL_STEPS:
            end_at = answered_at if end is None else moments.get(end)
            if moments.get(start) is not None and end_at is not None:
                steps[label].append(ms(end_at - moments[start]))
    return [(label, spread(values)["p50"]) for label, values in steps.items() if values], senders


def report(args, results: dict, load_start: str) -> None:
    command = " ".join(["uv run python bench/gateway.py", *sys.argv[1:]])
    lines = [
        *results_header("Gateway: tasks/get through taskhub vs the demo server's own", command, load_start),
        f"- {args.tasks} tasks, {args.rounds} rounds of {args.requests} tasks/get per path, {args.concurrency} at a "
        "time, alternating",
        "",
        "| path | tasks/get per s (median of rounds) | p50 ms | p95 ms | max ms | server CPU ms per request (median) |",
        "|---|---|---|---|---|---|",
    ]
    for path, label in (
        ("gateway", "gateway (/mcp/servers/demo, Postgres)"),
        ("demo", "demo server directly"),
        ("floor", "daphne alone (bench/daphne_floor.py: no Django, no database)"),
    ):
        rates = sorted(results[path]["rates"])
        spreads = spread(results[path]["ms"])
        lines.append(
            f"| {label} | {rates[len(rates) // 2]:,.0f} | {spreads['p50']:.1f} | {spreads['p95']:.1f} | "
            f"{spreads['max']:.1f} | {sorted(results[path]['cpu_ms'])[len(rates) // 2]:.2f} |"
        )
    gateway_rate = sorted(results["gateway"]["rates"])[len(rates) // 2]
    demo_rate = sorted(results["demo"]["rates"])[len(rates) // 2]
    floor_rate = sorted(results["floor"]["rates"])[len(rates) // 2]
    lines.append(
        f"\n- gateway / demo server: {gateway_rate / demo_rate:.2f}x the rate (issue 37 item 1's goal: >= 0.8x); "
        f"daphne alone / demo server: {floor_rate / demo_rate:.2f}x, the most any answer on one daphne reaches; "
        f"gateway / daphne alone: {gateway_rate / floor_rate:.2f}x"
    )
    if args.calls:
        figures = {path: spread(results["calls"][path]) for path in CALL_PATHS if path in results["calls"]}
        names = {
            "gateway": "gateway, sending the call itself (taskhub/gateway/sending.py)",
            "gateway_before": f"the same from --baseline-tree {args.baseline_tree} (before)",
            "gateway_by_worker": "gateway with TASKHUB_GATEWAY_SENDS_CALLS=0 (the worker sends it, answer woken)",
            "demo": "demo server directly",
        }
        lines += [
            "",
            f"`tools/call` of the demo's `quick` tool (an echo), {args.calls} per path, one at a time, alternating:",
            "",
            "| path | p50 ms | p95 ms | max ms | adds p50 ms |",
            "|---|---|---|---|---|",
            *(
                f"| {names[path]} | {figure['p50']:.1f} | {figure['p95']:.1f} | {figure['max']:.1f} | "
                f"{figure['p50'] - figures['demo']['p50']:.1f} |"
                for path, figure in figures.items()
            ),
            "",
            f"- the gateway adds {figures['gateway']['p50'] - figures['demo']['p50']:.1f} ms p50 (issue 37 item 1's "
            "goal: <= 10 ms)",
        ]
        if "gateway_before" in figures:
            now, then = figures["gateway"], figures["gateway_before"]
            lines.append(
                f"- this tree against the one before: p50 {now['p50'] - then['p50']:+.1f} ms, "
                f"p95 {now['p95'] - then['p95']:+.1f} ms"
            )
        for path, (steps, senders) in results.get("call_steps", {}).items():
            lines.append(
                f"- {names[path]}: sent by "
                + ", ".join(f"{actor} {count}" for actor, count in sorted(senders.items()))
                + "; p50 of each step: "
                + "; ".join(f"{label} {value:.1f} ms" for label, value in steps)
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_record:
        append_results(ROOT / "bench" / "RESULTS.md", text)


# --- --listen: idle subscriptions/listen streams ---------------------------------------------------------------

STREAMS_PER_TOKEN = 20
ASGI_APPLICATION = "taskhub.asgi:application"
CHANGE_TIMEOUT_SECONDS = 30.0
GOAL_KB_PER_STREAM = 30.0  # issue 37 item 4: memory per idle listen stream
# The demo's `long` reports each second: its listeners would not be idle. One step of ten minutes says nothing.
QUIET_TASK = {"steps": 1, "step_ms": 600_000}


def database_transactions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def database_connections() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_of(pid: int) -> int:
    """Resident memory in bytes (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def counters(pid: int) -> tuple[int, float, float]:
    from django.db import connection

    counted = database_transactions(), cpu_seconds(pid), time.monotonic()
    connection.close()  # this thread's: not among the connections while the window runs
    return counted


def window_figures(pid: int, before: tuple[int, float, float]) -> dict:
    from django.db import connection

    transactions, cpu, started = before
    elapsed = time.monotonic() - started
    # Less one: this very query (pg_stat_database's counters are read once per transaction, at its first read).
    figures = {
        "tps": (database_transactions() - transactions - 1) / elapsed,
        "cpu": 100 * (cpu_seconds(pid) - cpu) / elapsed,
        "threads": threads_of(pid),
        "rss": rss_of(pid),
        "connections": database_connections() - 1,  # less this query's own
    }
    connection.close()
    return figures


async def window(pid: int, seconds: float) -> dict:
    """Over `seconds` of nothing changing: the database's transactions per second, daphne's CPU % of one core,
    its threads and the database's connections at the end."""
    before = await asyncio.to_thread(counters, pid)
    await asyncio.sleep(seconds)
    return await asyncio.to_thread(window_figures, pid, before)


def daphne_alone():
    """daphne serving bench/daphne_floor.py (the floor of one daphne)."""
    return daphne_from(ROOT / "bench", {}, application="daphne_floor:application", label="floor")


@contextlib.contextmanager
def daphne_from(tree: Path, env: dict[str, str], *, application: str = ASGI_APPLICATION, label: str = "baseline"):
    """daphne serving `application` of the checkout at `tree` (this venv's packages), on the benchmark's database and
    Redis."""
    from browser_fixtures import daphne_process
    from helpers import free_port

    port = free_port()
    environment = {**os.environ, **env, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    log_path = ROOT / "test-output" / f"daphne-{label}-{port}.log"
    with daphne_process(port=port, env=environment, cwd=tree, log_path=log_path, application=application) as server:
        yield server


async def open_streams(base_url: str, server_name: str, tokens: list[str], task_ids: list[str], count: int) -> list:
    """`count` streams, each past its acknowledgement and its task as it is now; [(response, session)]."""
    url = f"{base_url}/mcp/servers/{server_name}"
    sessions = [
        aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"}, connector=aiohttp.TCPConnector(limit=STREAMS_PER_TOKEN)
        )
        for token in tokens
    ]

    async def one(n: int):
        session = sessions[n // STREAMS_PER_TOKEN]
        task_id = task_ids[n % len(task_ids)]
        payload = body("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}, n)
        response = await session.post(url, data=payload, headers=routing("subscriptions/listen"))
        if response.content_type != "text/event-stream":
            raise SystemExit(f"subscriptions/listen refused ({response.status}): {await response.text()}")
        while b"notifications/tasks" not in await response.content.readline():
            pass
        return response, task_id

    streams = []
    for start in range(0, count, 50):  # 50 at a time: the opening is not what is measured
        streams += await asyncio.gather(*(one(n) for n in range(start, min(start + 50, count))))
    return streams, sessions


def commit_change(task_id: str, message: str) -> None:
    from django.db import connection
    from helpers import snapshot

    from taskhub.tasks import services
    from taskhub.tasks.models import Task

    task = Task.objects.get(pk=task_id)
    now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    wire = snapshot("working", task_id=task.remote_task_id, last_updated_at=now, statusMessage=message)
    if not services.apply_snapshot(task=task, snapshot=wire):
        raise SystemExit(f"the change to task {task_id} was not stored")
    connection.close()


async def change_latencies(stream, task_id: str, changes: int) -> list[float]:
    """ms from just before a change is committed (in this process, published through Redis as a worker's) to its
    notification read from `stream`."""
    latencies = []

    async def until(message: str) -> None:
        while True:
            line = await stream.content.readline()
            if not line:
                raise SystemExit("the stream ended")
            if line.startswith(b"data: ") and message.encode() in line:
                return

    for n in range(changes):
        message = f"bench change {uuid.uuid4().hex}"
        reading = asyncio.create_task(until(message))
        started = time.perf_counter()
        await asyncio.to_thread(commit_change, task_id, message)
        try:
            await asyncio.wait_for(reading, CHANGE_TIMEOUT_SECONDS)
        except TimeoutError:
            say(
                f"change {n + 1} did not reach the agent within {CHANGE_TIMEOUT_SECONDS:.0f} s: the latencies stop here"
            )
            break
        latencies.append(ms(time.perf_counter() - started))
        await asyncio.sleep(0.2 + 0.15 * (n % 3))  # not in step with a 0.5 s poll
    return latencies


async def measure_listen(args, daphnes: dict, server_name: str, tokens: list[str], task_ids: list[str]) -> dict:
    """Per daphne: the floor (no stream), the streams held idle, the change latencies."""
    results = {}
    for label, web in daphnes.items():
        pid = web.process.pid
        say(f"{label}: {args.hold:.0f} s with no stream")
        floor = await window(pid, args.hold)
        say(f"{label}: opening {args.streams} streams")
        streams, sessions = await open_streams(web.url, server_name, tokens, task_ids, args.streams)
        try:
            say(f"{label}: {args.hold:.0f} s with {args.streams} idle streams")
            held = await window(pid, args.hold)
            say(f"{label}: {args.changes} changes to a listened task")
            stream, task_id = streams[0]
            latencies = await change_latencies(stream, task_id, args.changes)
        finally:
            for response, _ in streams:
                response.close()
            for session in sessions:
                await session.close()
        results[label] = {"floor": floor, "held": held, "ms": latencies}
        say(f"{label}: {held['tps'] - floor['tps']:.2f} transactions/s over the floor, daphne {held['cpu']:.1f}% "
            f"of a core, {len(latencies)} changes reached the agent")  # fmt: skip
    return results


def listen_main(args) -> None:
    load_start = load()
    # The gateway refuses streams past TASKHUB_GATEWAY_STREAMS_TOTAL (500 by default): room for all of them.
    os.environ.setdefault("TASKHUB_GATEWAY_STREAMS_TOTAL", str(max(500, args.streams)))
    env = prepare(args.database_url, args.redis_url, f"benchgateway{os.getpid()}")
    from account_fixtures import make_user
    from demo_process import DemoServer
    from stack_fixtures import register_and_discover

    from taskhub.accounts.groups import ADMINS
    from taskhub.api.tokens import create_token

    try:
        with contextlib.ExitStack() as stack:
            demo = stack.enter_context(DemoServer("--poll-interval-ms", str(args.upstream_poll_ms)))
            web, _worker = stack.enter_context(web_and_worker(env, f"bench-gateway-{os.getpid()}"))
            daphnes = {"now": web}
            if args.baseline_tree:
                daphnes["before"] = stack.enter_context(daphne_from(Path(args.baseline_tree), env))
            agent = make_user(f"agent-{uuid.uuid4().hex[:6]}", ADMINS)
            server = register_and_discover(demo, agent, name="demo")
            tokens = [
                create_token(user=agent, name=f"bench {n}")[1] for n in range(-(-args.streams // STREAMS_PER_TOKEN))
            ]

            url = f"{web.url}/mcp/servers/{server.name}"
            task_ids = launched_through_the_gateway(url, tokens[0], args.tasks, "progress", QUIET_TASK)
            results = asyncio.run(measure_listen(args, daphnes, server.name, tokens, task_ids))
    finally:
        drop(args.database_url)
    listen_report(args, results, load_start)


def listen_report(args, results: dict, load_start: str) -> None:
    command = " ".join(["uv run python bench/gateway.py", *sys.argv[1:]])
    lines = [
        *results_header("Gateway: idle subscriptions/listen streams", command, load_start),
        f"- {args.streams} streams over {args.tasks} running tasks, held {args.hold:.0f} s; the floor: the same window"
        " with no stream open (the worker's own work); transactions: pg_stat_database xact_commit + xact_rollback",
        "",
        "| daphne | transactions/s, no stream | with the streams | over the floor | daphne CPU % of a core (no "
        "stream → streams) | daphne threads | DB connections | daphne RSS MiB | KB per stream "
        "| change → agent p50 ms | p95 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, figures in results.items():
        floor, held = figures["floor"], figures["held"]
        spreads = spread(figures["ms"])
        reached = f"{len(figures['ms'])} of {args.changes}"
        lines.append(
            f"| {label} | {floor['tps']:.2f} | {held['tps']:.2f} | {held['tps'] - floor['tps']:.2f} | "
            f"{floor['cpu']:.1f} → {held['cpu']:.1f} | {floor['threads']} → {held['threads']} | "
            f"{floor['connections']} → {held['connections']} | "
            f"{floor['rss'] / 2**20:.1f} → {held['rss'] / 2**20:.1f} | "
            f"{(held['rss'] - floor['rss']) / 1024 / args.streams:.1f} (goal ≤ {GOAL_KB_PER_STREAM:g}) | "
            f"{spreads['p50']:.1f} | "
            f"{spreads['p95']:.1f} ({reached}) |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_record:
        append_results(ROOT / "bench" / "RESULTS.md", text)


if __name__ == "__main__":
    main()
