"""Fan-out: how long one task change takes to reach 2,000 WebSocket clients spread over TWO daphne processes
(issue 18 item 5; issue 6 item 5 was 500 on one), against the same clients receiving a tiny group message without
rendering, on as many daphnes, in the same run.

D `daphne taskhub.asgi:application` processes (production settings: DEBUG off, static files collected to a
temporary STATIC_ROOT, ALLOWED_HOSTS 127.0.0.1; HTTPS_ONLY off, plain HTTP on the loopback; the Redis channel layer
under a prefix of its own, a database of its own); N aiohttp clients, client i on daphne i mod D, each with the
session cookie of an operator (sessions made with Django's test Client force_login in this process, same
SECRET_KEY), connect to /ws/live/ with an Origin of its daphne's URL, as the task list page does. Then, C times:
a task is changed (its status_message, directly in the database) and publish_task_changed(task_id) is called
from this process; measured per client: the time from the publish call until a frame mentioning the task
arrived; p50/p99/max across clients and changes, and the daphnes' CPU per change. Connect time: from the first
connect until every client had its first frame (the live socket sends the user's fragments on connect), and per
client. Baseline in the same run: the same clients on as many daphnes serving bench/fanout_baseline.py (same
middleware and channel layer, a consumer that forwards a group message as it is) and one plain group_send of a
tiny message, timed the same way: the transport without the rendering. The baseline's sockets each join the group
(one Redis message per socket and change); taskhub's join through their process's hub (taskhub/live/hub.py, one
message per process), so taskhub can beat its baseline.
Goal of issue 18: all clients have the change within 1 s (p99). Memory (issue 37 item 4): the daphnes' RSS with no
socket, at `--memory-at` sockets and with all connected; KB per idle socket against the baseline's (goal ≤ 60 KB).

    uv run python bench/fanout.py                                  # 2,000 clients over 2 daphnes, 5 changes
    uv run python bench/fanout.py --clients 500 --daphnes 1        # issue 6's figure
    uv run python bench/fanout.py --clients 50 --changes 2 --no-record    # a quick look

Postgres: --database-url (default $BENCH_FANOUT_DATABASE_URL or
postgres://postgres@127.0.0.1:5432/taskhub_bench_fanout), dropped and created by the benchmark.
Redis: --redis-url (default redis://127.0.0.1:6379/0), channel prefix benchfanout<pid>.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from benchlib import cpu_busy, free_port, machine, percentile, set_database

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench_fanout"
SECRET_KEY = "taskhub-bench-only-not-secret"
GOAL_P99_MS = 1000.0
GOAL_KB_PER_SOCKET = 60.0  # issue 37 item 4
LIST_TASKS = 100
T0 = time.monotonic()
CONNECT_ATTEMPTS = 5


def prepare(clients: int) -> dict:
    """An operator, a server, LIST_TASKS tasks, and one session per client."""
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from taskhub.accounts.groups import OPERATORS
    from taskhub.servers.models import Server, Transport
    from taskhub.tasks.models import Task, TaskStatus

    operator = User.objects.create_user("bench-operator", password=None)
    operator.groups.add(Group.objects.get(name=OPERATORS))
    server = Server.objects.create(name="bench-server", transport=Transport.HTTP, url="http://127.0.0.1:9/mcp")
    tasks = Task.objects.bulk_create(
        Task(server=server, tool="slow_tool", launched_by=operator, remote_task_id=f"r{n}", status=TaskStatus.WORKING)
        for n in range(LIST_TASKS)
    )
    cookies = []
    for _ in range(clients):
        client = Client()
        client.force_login(operator)
        cookies.append(f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}")
    return {"task_id": tasks[0].pk, "cookies": cookies}


def start_daphne(app: str, port: int, env: dict) -> subprocess.Popen:
    daphne = Path(sys.executable).parent / "daphne"
    process = subprocess.Popen(
        [str(daphne), "-b", "127.0.0.1", "-p", str(port), app],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(f"/tmp/bench-fanout-daphne-{port}.log", "w"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"daphne exited ({process.returncode}); see /tmp/bench-fanout-daphne-{port}.log")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("daphne did not listen within 60 s")


def stop_all(daphnes: list[subprocess.Popen]) -> None:
    for daphne in daphnes:
        daphne.terminate()
    for daphne in daphnes:
        try:
            daphne.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daphne.kill()


class Listener:
    """One WebSocket client: records when a frame containing the awaited marker arrives."""

    def __init__(self) -> None:
        self.marker: str | None = None
        self.arrived: asyncio.Future | None = None
        self.frames = 0

    async def read(self, ws) -> None:
        import aiohttp

        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            now = time.perf_counter()
            self.frames += 1
            if self.marker is not None and self.marker in message.data and not self.arrived.done():
                self.arrived.set_result(now)


async def run_phase(
    kind: str,
    ports: list[int],
    cookies: list[str],
    changes: int,
    change,
    concurrency: int,
    timeout: float,
    *,
    rss=None,
    memory_marks: tuple[int, ...] = (),
):
    """Connect every client (client i to ports[i mod len(ports)]), then `changes` times: change(k) → (t0, marker);
    wait for every client's frame. `rss()`: the daphnes' resident memory, read with no socket open and once each of
    `memory_marks` clients are connected (1 s after the last connect)."""
    import aiohttp

    listeners = [Listener() for _ in cookies]
    sockets = []
    readers = []
    connect_times = []
    retries: list[str] = []
    semaphore = asyncio.Semaphore(concurrency)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout()
    )

    async def connect(index: int) -> None:
        # Like the htmx ws extension, a refused or dropped handshake is retried (after 1 s); counted in `retries`.
        async with semaphore:
            port = ports[index % len(ports)]
            base = f"http://127.0.0.1:{port}"
            url = f"ws://127.0.0.1:{port}/ws/live/"
            t0 = time.perf_counter()
            for attempt in range(CONNECT_ATTEMPTS):
                try:
                    ws = await session.ws_connect(
                        url, headers={"Origin": base, "Cookie": cookies[index]}, heartbeat=None, max_msg_size=0
                    )
                    first = await ws.receive(timeout=timeout)
                    if first.type != aiohttp.WSMsgType.TEXT:
                        raise RuntimeError(f"client {index}: no first frame but {first.type} {first.data}")
                    break
                except (aiohttp.ClientError, RuntimeError, TimeoutError) as error:
                    retries.append(f"{type(error).__name__}: {error}"[:120])
                    if attempt == CONNECT_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(1)
            connect_times.append((time.perf_counter() - t0) * 1000)
            sockets.append(ws)
            readers.append(asyncio.create_task(listeners[index].read(ws)))

    memory = {0: rss()} if rss is not None else {}
    marks = sorted({mark for mark in memory_marks if 0 < mark < len(cookies)} | {len(cookies)})
    started = time.perf_counter()
    connected = 0
    for mark in marks:
        await asyncio.gather(*(connect(index) for index in range(connected, mark)))
        connected = mark
        if rss is not None:
            await asyncio.sleep(1)  # the last handshakes' work done
            memory[mark] = rss()
    all_connected_s = time.perf_counter() - started - (len(marks) if rss is not None else 0)
    await asyncio.sleep(1)

    latencies, per_change, missing = [], [], 0
    loop = asyncio.get_running_loop()
    for k in range(changes):
        for listener in listeners:
            listener.marker = None
            listener.arrived = loop.create_future()
        prepared = await loop.run_in_executor(None, change, k, "prepare")
        for listener in listeners:
            listener.marker = prepared
        t0, cpu = await loop.run_in_executor(None, change, k, "publish")
        done, pending = await asyncio.wait([listener.arrived for listener in listeners], timeout=timeout)
        missing += len(pending)
        these = [(future.result() - t0) * 1000 for future in done]
        latencies += these
        cpu_after = cpu()
        per_change.append({"p50": statistics.median(these), "max": max(these), "daphne_cpu_s": cpu_after})
        await asyncio.sleep(1)

    for ws in sockets:
        await ws.close()
    for reader in readers:
        reader.cancel()
    await session.close()
    return {
        "kind": kind,
        "all_connected_s": all_connected_s,
        "connect": connect_times,
        "latencies": latencies,
        "missing": missing,
        "retries": retries,
        "per_change": per_change,
        "memory": memory,
    }


def memory_lines(results: list[dict], daphnes: int) -> list[str]:
    """The daphnes' RSS with 0, some and all sockets open, and the memory per idle socket (issue 37 item 4: ≤ 60 KB)
    from none to all, against the baseline consumer's (it renders nothing)."""
    lines = ["", f"Memory (RSS of the {daphnes} daphne(s) together, idle sockets):", ""]
    lines += ["| server | " + " | ".join(f"{mark:,} sockets" for mark in results[0]["memory"]) + " | KB per socket |"]
    lines += ["|---|" + "---:|" * (len(results[0]["memory"]) + 1)]
    per_socket = {}
    for outcome in results:
        memory = outcome["memory"]
        most = max(memory)
        per_socket[outcome["kind"]] = (memory[most] - memory[0]) / 1024 / most
        cells = " | ".join(f"{rss / 2**20:,.1f} MiB" for rss in memory.values())
        lines.append(f"| {outcome['kind']} | {cells} | {per_socket[outcome['kind']]:.1f} |")
    if "taskhub" in per_socket:
        met = "yes" if per_socket["taskhub"] <= GOAL_KB_PER_SOCKET else "no"
        lines += ["", f"taskhub KB per idle socket: {per_socket['taskhub']:.1f} (goal ≤ {GOAL_KB_PER_SOCKET:g}: {met})"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--daphnes", type=int, default=2, help="daphne processes, the clients spread over them")
    parser.add_argument("--changes", type=int, default=5)
    parser.add_argument("--connect-concurrency", type=int, default=20, help="connects in flight at once")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all clients per change")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_FANOUT_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--redis-socket-timeout",
        type=float,
        help="run with bench/fanout_settings.py: this socket timeout for the channel layer's Redis connections "
        "(default: taskhub.settings as deployed, i.e. redis-py's 5 s)",
    )
    parser.add_argument(
        "--layer",
        choices=("core", "pubsub"),
        default="core",
        help="pubsub: channels_redis's RedisPubSubChannelLayer (with bench/fanout_settings.py), to compare",
    )
    parser.add_argument(
        "--memory-at",
        type=lambda text: [int(part) for part in text.split(",") if part],
        default=[500],
        help="also read the daphnes' RSS once this many clients are connected (comma-separated; default 500)",
    )
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()

    import psutil

    command = "uv run python bench/fanout.py " + " ".join(sys.argv[1:])
    load_start = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"fan-out: {args.clients} WebSocket clients on {args.daphnes} daphne(s), {args.changes} changes; "
        f"machine shared (load {load_start})",
        flush=True,
    )
    prefix = f"benchfanout{os.getpid()}"
    static_root = tempfile.mkdtemp(prefix="bench-fanout-static-")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": (
            "bench.fanout_settings" if args.redis_socket_timeout or args.layer != "core" else "taskhub.settings"
        ),
        "BENCH_CHANNEL_LAYER": args.layer,
        "BENCH_REDIS_SOCKET_TIMEOUT": str(args.redis_socket_timeout or ""),
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "REDIS_CHANNEL_PREFIX": prefix,
        "SECRET_KEY": SECRET_KEY,
        # Production settings (issue 18 item 6), on plain HTTP: the clients and daphne share the loopback.
        "DEBUG": "false",
        "HTTPS_ONLY": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "STATIC_ROOT": static_root,
    }
    set_database(args.database_url, create=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer
    from django.db import connections
    from django.utils import timezone

    from taskhub.live.publish import publish_task_changed
    from taskhub.tasks.models import Task

    print(f"[{time.monotonic() - T0:.0f} s] migrated; making {args.clients} sessions", flush=True)
    data = prepare(args.clients)
    task_id = data["task_id"]
    results = []
    busy0, total0 = cpu_busy()
    try:
        for kind, app in (("baseline", "bench.fanout_baseline:application"), ("taskhub", "taskhub.asgi:application")):
            if kind == "baseline" and args.no_baseline:
                continue
            ports = [free_port() for _ in range(args.daphnes)]
            print(f"[{time.monotonic() - T0:.0f} s] {kind}: starting daphne {app} on ports {ports}", flush=True)
            daphnes = []
            try:
                for port in ports:
                    daphnes.append(start_daphne(app, port, env))
            except BaseException:
                stop_all(daphnes)
                raise
            print(f"[{time.monotonic() - T0:.0f} s] {kind}: daphnes listen; connecting", flush=True)
            watched = [psutil.Process(daphne.pid) for daphne in daphnes]

            def daphne_cpu(watched=watched) -> float:
                return sum(times.user + times.system for times in (process.cpu_times() for process in watched))

            def daphne_rss(watched=watched) -> int:
                return sum(process.memory_info().rss for process in watched)

            state = {}

            def change(k: int, step: str, kind=kind, state=state, daphne_cpu=daphne_cpu):
                if step == "prepare":
                    if kind == "baseline":
                        state["marker"] = f"ping-{k}-{uuid.uuid4().hex}"
                    else:
                        Task.objects.filter(pk=task_id).update(status_message=f"change {k}", updated_at=timezone.now())
                        state["marker"] = str(task_id)
                    return state["marker"]
                state["cpu0"] = daphne_cpu()
                t0 = time.perf_counter()
                if kind == "baseline":
                    async_to_sync(get_channel_layer().group_send)(
                        "bench-fanout-baseline", {"type": "bench.ping", "text": state["marker"]}
                    )
                else:
                    publish_task_changed(task_id)
                connections.close_all()
                return t0, lambda: daphne_cpu() - state["cpu0"]

            try:
                outcome = asyncio.run(
                    run_phase(
                        kind,
                        ports,
                        data["cookies"],
                        args.changes,
                        change,
                        args.connect_concurrency,
                        args.timeout,
                        rss=daphne_rss,
                        memory_marks=tuple(args.memory_at),
                    )
                )
            finally:
                stop_all(daphnes)
            print(f"[{time.monotonic() - T0:.0f} s] {kind}: daphnes stopped", flush=True)
            results.append(outcome)
            lat = outcome["latencies"]
            print(
                f"{kind}: all {args.clients} connected in {outcome['all_connected_s']:.2f} s; change → frame "
                f"p50 {statistics.median(lat):.0f} ms, p99 {percentile(lat, 0.99):.0f} ms, max {max(lat):.0f} ms, "
                f"missing {outcome['missing']}",
                flush=True,
            )
    finally:
        connections.close_all()
        set_database(args.database_url, create=False)
        shutil.rmtree(static_root, ignore_errors=True)
    busy1, total1 = cpu_busy()

    lines = [
        f"## Fan-out, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"- command: `{command.strip()}`",
        f"- machine: {machine()}; load average at start {load_start}, at end "
        + ", ".join(f"{value:.1f}" for value in os.getloadavg()),
        f"- **shared machine**: over the run the 2 cores were {(busy1 - busy0) / (total1 - total0) * 100:.0f}% busy "
        f"(daphne, the {args.clients} clients in this one asyncio process, Redis, Postgres and others' tests, "
        "all unpinned)",
        f"- {args.daphnes} daphne process(es), client i on daphne i mod {args.daphnes} (DEBUG off, static files "
        f"collected, Redis channel layer, prefix `{prefix}`, settings `{env['DJANGO_SETTINGS_MODULE']}`"
        + (f", Redis socket_timeout {args.redis_socket_timeout:g} s" if args.redis_socket_timeout else "")
        + (", channels_redis pub/sub layer" if args.layer == "pubsub" else "")
        + f"), {args.clients} aiohttp clients with an "
        f"operator's session cookie on /ws/live/ (Origin: the daphne URL), connected {args.connect_concurrency} at a "
        f"time; {args.changes} changes of one task, each `publish_task_changed` from this process, 1 s apart; "
        f"latency = frame mentioning the change received - publish called; {LIST_TASKS} tasks in the database",
        f"- baseline: the same clients on {args.daphnes} daphne(s) serving `bench/fanout_baseline.py` (same "
        "middleware and channel layer, no rendering) and one plain `group_send` of a tiny message",
        "",
        "| server | all connected s | connect p50 ms | connect p99 ms | change → all p50 ms | p99 ms | max ms "
        "| missing | daphne CPU s per change | p99 ≤ 1 s | failed handshakes (retried) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for outcome in results:
        lat = outcome["latencies"] or [float("nan")]
        cpu = statistics.mean(change["daphne_cpu_s"] for change in outcome["per_change"])
        lines.append(
            f"| {outcome['kind']} | {outcome['all_connected_s']:.2f} | {statistics.median(outcome['connect']):.0f} | "
            f"{percentile(outcome['connect'], 0.99):.0f} | {statistics.median(lat):.0f} | "
            f"{percentile(lat, 0.99):.0f} | "
            f"{max(lat):.0f} | {outcome['missing']} | {cpu:.2f} | "
            f"{'yes' if percentile(lat, 0.99) <= GOAL_P99_MS and not outcome['missing'] else '**no**'} | "
            f"{len(outcome['retries'])} |"
        )
    if len(results) == 2:
        base, hub = (percentile(outcome["latencies"], 0.99) for outcome in results)
        lines += ["", f"p99 ratio taskhub / baseline transport: **{hub / base:.1f}x**"]
    lines += memory_lines(results, args.daphnes)
    lines += [
        "",
        "per change (p50 / max ms): "
        + "; ".join(
            f"{outcome['kind']}: " + ", ".join(f"{c['p50']:.0f}/{c['max']:.0f}" for c in outcome["per_change"])
            for outcome in results
        ),
        "",
    ]
    for outcome in results:
        if outcome["retries"]:
            first = sorted(set(outcome["retries"]))[:3]
            lines.append(f"{outcome['kind']}: handshakes retried {len(outcome['retries'])}x, e.g. " + "; ".join(first))
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        with args.results.open("a") as results_file:
            results_file.write("\n" + text)
        print(f"appended to {args.results}")


if __name__ == "__main__":
    main()
