"""Tracker throughput: how many live tasks ONE `manage.py worker` follows, against two baselines in the same run.

For N live tasks (all `working` forever on bench/fake_tasks_server.py, a raw-asyncio ext-tasks server in
its own process) this measures, over a fixed window after a warm-up:
  - sustained `tasks/get` per second, counted at the server;
  - poll lateness p50/p99, at the server: receive time minus due time (previous poll + pollIntervalMs);
  - CPU ms per poll of the polling process (psutil), and of its Postgres backends;
  - database statements per poll, counted by the tracker itself (its connection and its ORM threads,
    logged by the worker with TASKHUB_TRACKER_STATS_SECONDS=1), and transactions per poll from
    pg_stat_database as a cross-check (pg_stat_statements cannot be loaded: not in shared_preload_libraries);
for three pollers against the same server and the same task ids: taskhub (one `manage.py worker` on a
fresh database), the limit (a bare asyncio loop with aiohttp, no database) and the usual way (the same
loop through ONE long-lived `mcp` SDK `Client`). The fake server runs on core 0 and the poller on core 1
(taskset); Postgres and everything else on the machine are not pinned. Then a saturation run (a
pollIntervalMs so short that no poller keeps up) gives each one's maximum polls per second. Prints a
table with the ratios and the goals of issue 6, and appends it to bench/RESULTS.md.

    uv run python bench/tracker.py    # 1,000 / 5,000 / 10,000 tasks at 1,000 ms, then saturation (< 10 min)
    uv run python bench/tracker.py --tasks 1000 --duration 10 --no-saturation --no-record    # a quick look
    uv run python bench/tracker.py --tasks 5000 --systems taskhub,aiohttp --scale-out 10000   # issue 18 item 3
    uv run python bench/tracker.py --tasks 0,1000,5000,20000 --systems taskhub,aiohttp --no-saturation  # issue 37

Each poller's resident memory (RSS) at the end of its window is in the table; with two task counts or more, the
memory per followed task (RSS growth from the fewest to the most, per task; 0 tasks: the process's own floor) is
checked against issue 37's goal (≤ 20 KB), the aiohttp loop's beside it.

`--scale-out N` adds a run of two pollers following N tasks at 1,000 ms together: two `manage.py worker`s on one
database (sharing the rows by claims and leases), against two aiohttp loops of N/2 task ids each on the same
cores; per poller its polls, tasks and lateness (the fake server tells them apart by client port), the tasks
polled by both and the early polls (two polls of one task less than half an interval apart).

Postgres: --database-url (default $BENCH_DATABASE_URL or postgres://postgres@127.0.0.1:5432/taskhub_bench);
that database and <name>_tpl are dropped and created by the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench"
WORKER_NAME = "bench-worker"
SECRET_KEY = "taskhub-bench-only-not-secret"
QUIET_LOAD = 2.0
TARGETS = {
    "ratio_taskhub_aiohttp": 0.8,
    "ratio_aiohttp_sdk": 5.0,
    "lateness_p99_ms": 250.0,
    "lateness_ratio_to_aiohttp": 1.5,
    "kb_per_task": 20.0,  # issue 37 item 4: a worker's memory per followed task
}


# --- the baseline loops (run as child processes: `bench/tracker.py --loop aiohttp|sdk ...`) ---------------


def task_ids(count: int) -> list[str]:
    return [f"bench-{count}-{index:06d}" for index in range(count)]


async def poll_loop(poll_one, ids: list[str], interval_ms: int, concurrency: int, stop: asyncio.Event) -> int:
    """Poll every task once per interval (due = previous answer + the pollIntervalMs it carried), at most
    `concurrency` at once, earliest due first. The first round is spread over one interval."""
    start = time.monotonic()
    heap = [(start + index / len(ids) * interval_ms / 1000, task_id) for index, task_id in enumerate(ids)]
    heapq.heapify(heap)
    polls = 0

    async def worker() -> None:
        nonlocal polls
        while not stop.is_set():
            if not heap:
                await asyncio.sleep(0.001)
                continue
            due, task_id = heapq.heappop(heap)
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                interval = await poll_one(task_id)
            except Exception as error:  # a baseline must not die of one failure either
                print(f"poll failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
                interval = 1000
            polls += 1
            heapq.heappush(heap, (time.monotonic() + (interval or interval_ms) / 1000, task_id))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return polls


async def aiohttp_loop(url: str, ids: list[str], interval_ms: int, concurrency: int, stop: asyncio.Event) -> int:
    import aiohttp

    from taskhub.mcp import wire
    from taskhub.mcp.client import CLIENT_INFO

    meta = wire.request_meta(client_info=CLIENT_INFO)
    request_ids = itertools.count(1)
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    async with aiohttp.ClientSession(
        headers=headers,
        connector=aiohttp.TCPConnector(limit=concurrency),
        timeout=aiohttp.ClientTimeout(total=10),
        cookie_jar=aiohttp.DummyCookieJar(),
    ) as session:

        async def poll_one(task_id: str) -> int | None:
            body = {"jsonrpc": "2.0", "id": next(request_ids), "method": "tasks/get"}
            body["params"] = {"taskId": task_id, "_meta": meta}
            payload = json.dumps(body, separators=(",", ":")).encode()
            route = wire.task_request_headers(method="tasks/get", task_id=task_id)
            async with session.post(url, data=payload, headers=route) as response:
                message = json.loads(await response.read())
            return message["result"].get("pollIntervalMs")

        return await poll_loop(poll_one, ids, interval_ms, concurrency, stop)


async def sdk_loop(url: str, ids: list[str], interval_ms: int, concurrency: int, stop: asyncio.Event) -> int:
    import httpx2
    import mcp_types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from pydantic import TypeAdapter

    from taskhub.mcp import wire
    from taskhub.mcp.client import CLIENT_INFO
    from taskhub.mcp.extension import GetTaskRequest, TaskIdParams, TasksClientExtension, decline_elicitation

    raw = TypeAdapter(dict)
    http = create_mcp_http_client(timeout=httpx2.Timeout(10.0, read=30.0))
    client = Client(
        streamable_http_client(url, http_client=http),
        read_timeout_seconds=10.0,
        client_info=mcp_types.Implementation.model_validate(CLIENT_INFO),
        elicitation_callback=decline_elicitation,
        extensions=[TasksClientExtension()],
        mode="auto",
        cache=None,
    )
    async with http, client:

        async def poll_one(task_id: str) -> int | None:
            result = await client.session.send_request(
                GetTaskRequest(params=TaskIdParams(task_id=task_id)), raw, request_read_timeout_seconds=10.0
            )
            return wire.parse_get_task_result(result).poll_interval_ms

        return await poll_loop(poll_one, ids, interval_ms, concurrency, stop)


def run_child_loop(options) -> None:
    # Imports first (pydantic builds the SDK's models for seconds on a busy machine): "running" means ready.
    import aiohttp  # noqa: F401
    import mcp  # noqa: F401

    import taskhub.mcp.extension  # noqa: F401

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        kind = {"aiohttp": aiohttp_loop, "sdk": sdk_loop}[options.loop]
        print(f"{options.loop} loop running, pid {os.getpid()}", flush=True)
        ids = task_ids(options.loop_tasks)
        part, parts = (int(number) for number in options.loop_part.split("/"))
        ids = ids[part::parts]
        polls = await kind(options.url, ids, options.poll_interval_ms, options.concurrency, stop)
        print(f"{options.loop} loop stopped after {polls} polls", flush=True)

    asyncio.run(main())


# --- the orchestrator ----------------------------------------------------------------------------------


def machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    import psutil

    memory = psutil.virtual_memory().total / 2**30
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({model}), {memory:.0f} GiB memory, Linux {platform.release()}, "
        f"Python {platform.python_version()}, load average at start {load}"
    )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_json(url: str, method: str = "GET") -> dict:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"{}")


def pinned(core: int | None, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *command] if core is not None else command


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


class FakeServer:
    def __init__(self, interval_ms: int, core: int | None) -> None:
        self.port = free_port()
        self.interval_ms = interval_ms
        command = [sys.executable, str(BENCH / "fake_tasks_server.py"), "--port", str(self.port)]
        command += ["--poll-interval-ms", str(interval_ms)]
        self.process = subprocess.Popen(pinned(core, command), stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if "fake tasks server" not in line:
            raise RuntimeError(f"the fake server did not start: {line!r}")
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/mcp"

    def stats(self) -> dict:
        return http_json(self.base + "/stats")

    def mark(self) -> None:
        http_json(self.base + "/mark", "POST")

    def clear(self) -> None:
        http_json(self.base + "/clear", "POST")

    def name_groups(self, ports: dict[int, str]) -> None:
        body = json.dumps({"ports": {str(port): group for port, group in ports.items()}}).encode()
        request = urllib.request.Request(self.base + "/groups", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def sample(self, task_id: str) -> dict:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": task_id}}
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["result"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class Database:
    """The benchmark's own databases on the given server: a migrated template, and a fresh copy per phase."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self.name = parts.path.lstrip("/")
        self.template = self.name + "_tpl"
        self.admin_url = urlunsplit(parts._replace(path="/postgres"))
        self.template_url = urlunsplit(parts._replace(path="/" + self.template))

    def admin(self):
        import psycopg

        return psycopg.connect(self.admin_url, autocommit=True)

    def prepare_template(self, env: dict) -> None:
        with self.admin() as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
            connection.execute(f'CREATE DATABASE "{self.template}"')
        migrate = [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"]
        subprocess.run(migrate, cwd=ROOT, env={**env, "DATABASE_URL": self.template_url}, check=True)

    def fresh(self) -> None:
        from django.db import connections

        connections.close_all()
        with self.admin() as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            connection.execute(f'CREATE DATABASE "{self.name}" TEMPLATE "{self.template}"')

    def drop_all(self) -> None:
        from django.db import connections

        connections.close_all()
        with self.admin() as connection:
            for name in (self.name, self.template):
                connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def counters(self) -> dict:
        """Transactions of the benchmark database, and its backends (pid → CPU seconds)."""
        import psutil

        with self.admin() as connection:
            connection.execute("SELECT pg_stat_clear_snapshot()")
            xacts = connection.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (self.name,)
            ).fetchone()[0]
            backends = connection.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.name,))
            pids = [row[0] for row in backends]
        cpu = {}
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                cpu[pid] = times.user + times.system
        return {"xacts": xacts, "backend_cpu": cpu}


def seed(count: int, url: str, sample: dict) -> None:
    """N live tasks on one server at `url`, as record_launch_outcome leaves them, not yet due."""
    from datetime import timedelta

    from django.utils import timezone

    from taskhub.servers.models import Server
    from taskhub.tasks.models import Task, TaskPoll, TaskStatus
    from taskhub.tasks.ttl import expires_at

    server = Server.objects.create(name="bench", transport="http", url=url)
    later = timezone.now() + timedelta(days=1)
    tasks = [
        Task(
            server=server,
            tool="bench",
            arguments={},
            remote_task_id=task_id,
            status=TaskStatus.WORKING,
            status_message=sample.get("statusMessage", ""),
            ttl_ms=sample.get("ttlMs"),
            poll_interval_ms=sample.get("pollIntervalMs"),
            remote_created_at=sample.get("createdAt", ""),
            remote_last_updated_at=sample.get("lastUpdatedAt", ""),
            expires_at=expires_at(remote_created_at=sample.get("createdAt", ""), ttl_ms=sample.get("ttlMs")),
        )
        for task_id in task_ids(count)
    ]
    Task.objects.bulk_create(tasks, batch_size=2000)
    TaskPoll.objects.bulk_create([TaskPoll(task=task, next_poll_at=later) for task in tasks], batch_size=2000)


def make_due(interval_ms: int) -> None:
    """Spread the first polls over one interval from now, as the baselines do."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE tasks_taskpoll AS poll SET next_poll_at = now() + ranked.position * %s * interval '1 millisecond'
            FROM (SELECT task_id, (row_number() OVER (ORDER BY task_id) - 1)::float8 / count(*) OVER () AS position
                  FROM tasks_taskpoll) AS ranked
            WHERE poll.task_id = ranked.task_id
            """,
            [interval_ms],
        )
    connection.close()


@dataclass
class Poller:
    """A running poller process and what it logs."""

    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    tracker_stats: list[tuple[float, dict]] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def drain(self, stream) -> None:
        for line in stream:
            if " stats {" in line and "tracker" in line:
                self.tracker_stats.append((time.monotonic(), json.loads(line[line.index(" stats {") + 7 :])))
            else:
                self.lines.append(line)
                del self.lines[:-50]
            if "running" in line:
                self.ready.set()

    def start_draining(self) -> None:
        for stream in (self.process.stdout, self.process.stderr):
            threading.Thread(target=self.drain, args=(stream,), daemon=True).start()

    def latest_tracker_stats(self) -> dict | None:
        return self.tracker_stats[-1][1] if self.tracker_stats else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Measured:
    system: str
    tasks: int
    interval_ms: int
    polls_per_second: float
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None
    cpu_ms_per_poll: float
    cpu_busy: float  # fraction of one core
    db_cpu_ms_per_poll: float | None
    statements_per_poll: float | None
    xacts_per_poll: float | None
    warmup_seconds: float
    others_busy: float  # fraction of the poller's core used by other processes (Postgres included) in the window
    load: float
    rss_mib: float = 0.0  # the poller's resident memory at the end of the window
    note: str = ""


@dataclass
class ScaleOut:
    system: str
    tasks: int
    interval_ms: int
    pollers: list[dict]  # each: name, polls_per_second, tasks, held, lateness_p50_ms, lateness_p99_ms, cpu_ms_per_poll
    lateness_p99_ms: float | None
    polls_per_second: float
    by_both: int  # tasks polled by both pollers in the window
    early_polls: int  # polls less than half an interval after the task's previous one
    unattributed_polls: int  # from a connection the port mapping did not know
    ports_changed: bool
    warmup_seconds: float
    load: float
    note: str = ""


class Bench:
    def __init__(self, options) -> None:
        self.options = options
        self.db = Database(options.database_url)
        self.env = {
            **os.environ,
            "DATABASE_URL": options.database_url,
            "SECRET_KEY": SECRET_KEY,
            "DEBUG": "false",
            "HTTPS_ONLY": "false",
            "LOG_LEVEL": "INFO",
            "TASKHUB_TRACKER_STATS_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        self.results: list[Measured] = []
        self.scale_out_results: list[ScaleOut] = []
        self.profile_written: str | None = None

    def log(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def setup_django(self) -> None:
        os.environ.update({key: self.env[key] for key in ("DATABASE_URL", "SECRET_KEY", "DEBUG", "HTTPS_ONLY")})
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskhub.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()

    def start_poller(
        self,
        system: str,
        server: FakeServer,
        tasks: int,
        interval_ms: int,
        *,
        name: str = WORKER_NAME,
        part: str = "0/1",
        core: int | None = -1,
    ) -> Poller:
        core = self.options.client_core if core == -1 else core
        if system == "taskhub":
            command = [sys.executable, "manage.py", "worker", "--name", name]
        else:
            command = [sys.executable, str(Path(__file__).resolve()), "--loop", system, "--url", server.url]
            command += ["--loop-tasks", str(tasks), "--poll-interval-ms", str(interval_ms)]
            command += ["--concurrency", str(self.options.concurrency), "--loop-part", part]
        process = subprocess.Popen(
            pinned(core, command), cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        poller = Poller(process)
        poller.start_draining()
        if not poller.ready.wait(180):  # minutes on a machine busy with test suites
            poller.stop()
            raise RuntimeError(f"{system} did not start:\n{''.join(poller.lines)}")
        return poller

    def phase(self, system: str, server: FakeServer, tasks: int, interval_ms: int, saturation: bool) -> Measured:
        import psutil

        options = self.options
        server.clear()
        if system == "taskhub":
            self.db.fresh()
            if tasks:  # none: the worker's own footprint, the floor of the memory per task
                seed(tasks, server.url, server.sample(task_ids(tasks)[0]))
            server.clear()
        poller = self.start_poller(system, server, tasks, interval_ms)
        profiler = None
        try:
            if system == "taskhub":
                make_due(interval_ms)
            started = time.monotonic()
            deadline = started + max(30.0, tasks / 500)
            while server.stats()["distinct_tasks"] < tasks and time.monotonic() < deadline:
                if poller.process.poll() is not None:
                    raise RuntimeError(f"{system} exited:\n{''.join(poller.lines)}")
                time.sleep(0.25)
            seen = server.stats()["distinct_tasks"]
            warmup = time.monotonic() - started
            time.sleep(options.warmup)
            process = psutil.Process(poller.process.pid)
            before_db = self.db.counters()
            before_stats = poller.latest_tracker_stats()
            before_cpu = sum(process.cpu_times()[:2])
            before_core = self.core_busy()
            server.mark()
            if saturation and system == "taskhub" and options.profile:
                profiler = self.start_profiler(poller.process.pid)
            time.sleep(options.duration)
            window = server.stats()["window"]
            after_cpu = sum(process.cpu_times()[:2])
            rss = process.memory_info().rss
            after_core = self.core_busy()
            after_db = self.db.counters()
            time.sleep(1.2)  # the next stats line covers the end of the window
            after_stats = poller.latest_tracker_stats()
        finally:
            if profiler is not None:
                self.finish_profiler(profiler)
            poller.stop()
        if options.verbose:
            print("".join(poller.lines[-20:]), poller.latest_tracker_stats(), flush=True)
        polls = max(window["polls"], 1)
        cpu = after_cpu - before_cpu
        db_cpu = statements = xacts = None
        if system == "taskhub":
            backend = after_db["backend_cpu"]
            db_cpu = sum(cpu_s - before_db["backend_cpu"].get(pid, 0.0) for pid, cpu_s in backend.items())
            db_cpu = db_cpu * 1000 / polls
            xacts = (after_db["xacts"] - before_db["xacts"]) / polls
            if before_stats and after_stats and after_stats["polls"] > before_stats["polls"]:
                statements = (after_stats["statements"] - before_stats["statements"]) / (
                    after_stats["polls"] - before_stats["polls"]
                )
        lateness = window["lateness_ms"]
        note = "" if seen >= tasks else f"only {seen} of {tasks} tasks polled in the warm-up"
        result = Measured(
            system=system,
            tasks=tasks,
            interval_ms=interval_ms,
            polls_per_second=window["polls_per_second"] or 0.0,
            lateness_p50_ms=lateness["p50"],
            lateness_p99_ms=lateness["p99"],
            cpu_ms_per_poll=cpu * 1000 / polls,
            cpu_busy=cpu / window["seconds"],
            db_cpu_ms_per_poll=db_cpu,
            statements_per_poll=statements,
            xacts_per_poll=xacts,
            warmup_seconds=warmup,
            others_busy=max(0.0, (after_core - before_core) - cpu) / window["seconds"],
            load=os.getloadavg()[0],
            rss_mib=rss / 2**20,
            note=note,
        )
        self.log(
            f"  {system:8} {result.polls_per_second:8.0f} polls/s  lateness p50 {result.lateness_p50_ms} ms "
            f"p99 {result.lateness_p99_ms} ms  cpu {result.cpu_ms_per_poll:.3f} ms/poll"
            f" ({result.cpu_busy:.0%} of a core)"
            f"  statements/poll {percent(statements)}  xacts/poll {percent(xacts)}  warm-up {warmup:.1f}s"
            f"  others on its core {result.others_busy:.0%}, RSS {result.rss_mib:.1f} MiB"
            f", load {result.load:.1f} {note}"
        )
        return result

    def core_busy(self) -> float:
        """CPU seconds the poller's core has been busy (all processes)."""
        import psutil

        if self.options.client_core is None:
            return 0.0
        times = psutil.cpu_times(percpu=True)[self.options.client_core]
        return times.user + times.nice + times.system + times.irq + times.softirq + times.steal

    def start_profiler(self, pid: int):
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(py_spy).exists():
            self.log("  (no py-spy: `uv pip install py-spy` for a profile)")
            return None
        out = Path(self.options.profile)
        command = [py_spy, "record", "-p", str(pid), "-d", str(int(self.options.duration)), "-r", "200"]
        command += ["-f", "raw", "-o", str(out), "--nonblocking"]
        return subprocess.Popen(
            pinned(self.options.server_core, command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def finish_profiler(self, profiler: subprocess.Popen) -> None:
        try:
            profiler.wait(30)
            self.profile_written = self.options.profile
        except subprocess.TimeoutExpired:
            profiler.kill()

    # -- scale-out: two pollers on one database (or two aiohttp loops of half the tasks each) ---------------------

    def scale_out_phase(self, system: str, server: FakeServer, tasks: int, interval_ms: int) -> ScaleOut:
        """Two pollers follow `tasks` together: two `manage.py worker`s on one database (they share the rows by
        their claims and leases), or two aiohttp loops of half the task ids each. The fake server tells whose
        poll is whose by the client port of its connection (each poller's ports, read with psutil)."""
        import psutil

        options = self.options
        server.clear()
        if system == "taskhub":
            self.db.fresh()
            if tasks:  # none: the worker's own footprint, the floor of the memory per task
                seed(tasks, server.url, server.sample(task_ids(tasks)[0]))
            server.clear()
        names = [f"{WORKER_NAME if system == 'taskhub' else system + '-loop'}-{letter}" for letter in "ab"]
        pollers: list[Poller] = []
        try:
            for index, (name, core) in enumerate(zip(names, options.scale_out_cores, strict=True)):
                pollers.append(
                    self.start_poller(system, server, tasks, interval_ms, name=name, part=f"{index}/2", core=core)
                )
            if system == "taskhub":
                make_due(interval_ms)  # both are running: both claim from the first poll on
            started = time.monotonic()
            deadline = started + max(60.0, tasks / 250)
            while server.stats()["distinct_tasks"] < tasks and time.monotonic() < deadline:
                for poller in pollers:
                    if poller.process.poll() is not None:
                        raise RuntimeError(f"{system} exited:\n{''.join(poller.lines)}")
                time.sleep(0.25)
            seen = server.stats()["distinct_tasks"]
            warmup = time.monotonic() - started
            time.sleep(options.warmup)
            processes = [psutil.Process(poller.process.pid) for poller in pollers]
            ports = self.client_ports(processes, names, server.port)
            server.name_groups(ports)
            before_cpu = [sum(process.cpu_times()[:2]) for process in processes]
            server.mark()
            time.sleep(options.duration)
            window = server.stats()["window"]
            after_cpu = [sum(process.cpu_times()[:2]) for process in processes]
            late_ports = self.client_ports(processes, names, server.port)
            held = self.held_by_owner() if system == "taskhub" else {}
        finally:
            for poller in pollers:
                poller.stop()
        groups = window["groups"]
        per_poller = []
        for index, name in enumerate(names):
            group = groups.get(name, {"polls": 0, "tasks": 0, "lateness_ms": {"p50": None, "p99": None}})
            per_poller.append(
                {
                    "name": name,
                    "polls_per_second": group["polls"] / window["seconds"],
                    "tasks": group["tasks"],
                    "held": held.get(name),
                    "lateness_p50_ms": group["lateness_ms"]["p50"],
                    "lateness_p99_ms": group["lateness_ms"]["p99"],
                    "cpu_ms_per_poll": (after_cpu[index] - before_cpu[index]) * 1000 / max(group["polls"], 1),
                }
            )
        result = ScaleOut(
            system=system,
            tasks=tasks,
            interval_ms=interval_ms,
            pollers=per_poller,
            lateness_p99_ms=window["lateness_ms"]["p99"],
            polls_per_second=window["polls_per_second"] or 0.0,
            by_both=window["tasks_polled_by_more_than_one_group"],
            early_polls=window["early_polls"],
            unattributed_polls=groups.get("other", {}).get("polls", 0),
            ports_changed=set(late_ports) != set(ports),
            warmup_seconds=warmup,
            load=os.getloadavg()[0],
            note="" if seen >= tasks else f"only {seen} of {tasks} tasks polled in the warm-up",
        )
        for poller in per_poller:
            self.log(
                f"  {system:8} {poller['name']}: {poller['polls_per_second']:7.0f} polls/s, {poller['tasks']} tasks"
                f" (leases held at the end: {poller['held']}), lateness p50 {poller['lateness_p50_ms']} ms"
                f" p99 {poller['lateness_p99_ms']} ms, cpu {poller['cpu_ms_per_poll']:.3f} ms/poll"
            )
        self.log(
            f"  {system:8} both: {result.polls_per_second:.0f} polls/s, tasks polled by both {result.by_both}, "
            f"early polls {result.early_polls}, unattributed polls {result.unattributed_polls}, "
            f"load {result.load:.1f} {result.note}"
        )
        return result

    @staticmethod
    def client_ports(processes, names: list[str], server_port: int) -> dict[int, str]:
        ports = {}
        for process, name in zip(processes, names, strict=True):
            for connection in process.net_connections(kind="tcp"):
                if connection.raddr and connection.raddr.port == server_port:
                    ports[connection.laddr.port] = name
        return ports

    def held_by_owner(self) -> dict[str, int]:
        import psycopg

        with psycopg.connect(self.db.url) as connection:
            rows = connection.execute("SELECT lease_owner, count(*) FROM tasks_taskpoll GROUP BY lease_owner")
            return dict(rows.fetchall())

    def scale_out(self, tasks: int, interval_ms: int) -> None:
        cores = ", ".join(str(core) for core in self.options.scale_out_cores)
        self.log(f"scale-out: {tasks} tasks, pollIntervalMs {interval_ms}, two pollers (cores {cores})")
        server = FakeServer(interval_ms, self.options.server_core)
        try:
            for system in self.options.systems:
                if system in ("taskhub", "aiohttp"):
                    self.scale_out_results.append(self.scale_out_phase(system, server, tasks, interval_ms))
        finally:
            server.stop()

    def configuration(self, tasks: int, interval_ms: int, saturation: bool = False) -> None:
        what = "saturation" if saturation else "steady"
        self.log(f"{tasks} tasks, pollIntervalMs {interval_ms} ({what})")
        server = FakeServer(interval_ms, self.options.server_core)
        try:
            for system in self.options.systems:
                self.results.append(self.phase(system, server, tasks, interval_ms, saturation))
        finally:
            server.stop()

    def run(self) -> None:
        options = self.options
        cores = f"fake server on core {options.server_core}, poller on core {options.client_core} (taskset)"
        self.started_at = datetime.now(UTC)
        self.machine = machine()
        self.load_at_start = os.getloadavg()[0]
        self.log(f"tracker throughput benchmark; {self.machine}")
        self.log(f"pinning: {cores}; Postgres and the rest of the machine are not pinned")
        self.setup_django()
        self.log("migrating the template database")
        self.db.prepare_template(self.env)
        try:
            for tasks in options.tasks:
                self.configuration(tasks, options.poll_interval_ms)
            if options.saturation_tasks:
                self.configuration(options.saturation_tasks, options.saturation_interval_ms, saturation=True)
            if options.scale_out:
                self.scale_out(options.scale_out, options.poll_interval_ms)
        finally:
            self.db.drop_all()
        report = self.report(cores)
        print()
        print(report)
        if options.record:
            with open(options.results, "a") as results:
                results.write("\n" + report)
            self.log(f"appended to {options.results}")

    # -- the report --------------------------------------------------------------------------------

    def find(self, system: str, tasks: int, interval_ms: int) -> Measured | None:
        for result in self.results:
            if (result.system, result.tasks, result.interval_ms) == (system, tasks, interval_ms):
                return result
        return None

    def report(self, cores: str) -> str:
        options = self.options
        command = "uv run python bench/tracker.py " + shlex.join(sys.argv[1:])
        label = f", {options.label}" if options.label else ""
        lines = [
            f"## Tracker throughput, {self.started_at:%Y-%m-%d %H:%M} UTC{label}",
            "",
            f"- command: `{command.strip()}`",
            f"- machine: {self.machine}",
            f"- quiet machine (issue 18: a 1-minute load under {QUIET_LOAD:g} at the start): "
            + ("yes" if self.load_at_start < QUIET_LOAD else f"no ({self.load_at_start:.1f}): read the ratios only"),
            "- settings: production (DEBUG=false, the worker as `manage.py worker` runs it)",
            f"- {cores}; Postgres 127.0.0.1:5432 unpinned; other work on the machine at the same time",
            f"- window {options.duration:g} s after all tasks were polled once + {options.warmup:g} s; baselines "
            f"poll with concurrency {options.concurrency}, taskhub with its per-server limit",
            "- statements/poll: counted by the tracker (its own connection + ORM threads); xacts/poll: "
            "pg_stat_database delta of the benchmark database (includes procrastinate); db cpu: its Postgres backends",
            "",
            "| tasks | pollIntervalMs | poller | polls/s | lateness p50 ms | lateness p99 ms | cpu ms/poll "
            "| cpu busy | db cpu ms/poll | statements/poll | xacts/poll | others on poller core | RSS MiB | load |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for result in self.results:
            lines.append(
                f"| {result.tasks:,} | {result.interval_ms:,} | {result.system} | {result.polls_per_second:,.0f} "
                f"| {result.lateness_p50_ms} | {result.lateness_p99_ms} | {result.cpu_ms_per_poll:.3f} "
                f"| {result.cpu_busy:.0%} | {percent(result.db_cpu_ms_per_poll)} "
                f"| {percent(result.statements_per_poll)} "
                f"| {percent(result.xacts_per_poll)} | {result.others_busy:.0%} | {result.rss_mib:.1f} "
                f"| {result.load:.1f} |" + (f" {result.note}" if result.note else "")
            )
        lines += ["", "| check | measured | goal | met |", "|---|---:|---:|---|"]
        sizes = [(tasks, options.poll_interval_ms) for tasks in options.tasks]
        if options.saturation_tasks:
            sizes.append((options.saturation_tasks, options.saturation_interval_ms))
        for tasks, interval_ms in sizes:
            if not tasks:  # measured for its memory only
                continue
            taskhub, limit, sdk = (self.find(name, tasks, interval_ms) for name in ("taskhub", "aiohttp", "sdk"))
            saturation = interval_ms == options.saturation_interval_ms and tasks == options.saturation_tasks
            where = f"{tasks:,} tasks @ {interval_ms} ms" + (" (saturation)" if saturation else "")
            if taskhub and limit:
                ratio = taskhub.polls_per_second / max(limit.polls_per_second, 1e-9)
                goal = TARGETS["ratio_taskhub_aiohttp"]
                met = self.met(ratio >= goal, saturation)
                lines.append(f"| taskhub / aiohttp polls/s, {where} | {ratio:.2f} | ≥ {goal} | {met} |")
                if saturation:
                    # The same ratio per CPU-second of the poller: robust to how much of the core others took.
                    per_cpu = limit.cpu_ms_per_poll / max(taskhub.cpu_ms_per_poll, 1e-9)
                    met = self.met(per_cpu >= goal, saturation)
                    check = f"taskhub / aiohttp polls per CPU-second, {where}"
                    lines.append(f"| {check} | {per_cpu:.2f} | ≥ {goal} | {met} |")
            if limit and sdk:
                ratio = limit.polls_per_second / max(sdk.polls_per_second, 1e-9)
                goal = TARGETS["ratio_aiohttp_sdk"]
                met = self.met(ratio >= goal, saturation)
                lines.append(f"| aiohttp / SDK polls/s, {where} | {ratio:.2f} | ≥ {goal} | {met} |")
            if taskhub and not saturation and taskhub.lateness_p99_ms is not None:
                goal = TARGETS["lateness_p99_ms"]
                met = "yes" if taskhub.lateness_p99_ms <= goal else "no"
                measured = f"{taskhub.lateness_p99_ms} ms"
                lines.append(f"| taskhub lateness p99, {where} | {measured} | ≤ {goal:g} ms | {met} |")
                if limit and limit.lateness_p99_ms is not None:
                    check = f"taskhub / aiohttp lateness p99, {where}"
                    lines.append(self.lateness_check(check, taskhub.lateness_p99_ms, limit.lateness_p99_ms))
        lines += self.memory_report()
        lines += self.scale_out_report()
        if self.profile_written:
            lines.append(f"\nprofile of the worker at saturation (py-spy raw): `{self.profile_written}`")
        return "\n".join(lines) + "\n"

    def memory_report(self) -> list[str]:
        """Memory per followed task (issue 37 item 4): each poller's RSS growth from the fewest tasks measured to the
        most, at the same poll interval, per task."""
        sizes = sorted(set(self.options.tasks))
        if len(sizes) < 2:
            return []
        lines = []
        for system in ("taskhub", "aiohttp", "sdk"):
            low, high = (self.find(system, tasks, self.options.poll_interval_ms) for tasks in (sizes[0], sizes[-1]))
            if low is None or high is None:
                continue
            per_task_kb = (high.rss_mib - low.rss_mib) * 1024 / (high.tasks - low.tasks)
            goal = f"≤ {TARGETS['kb_per_task']:g} KB" if system == "taskhub" else "baseline"
            met = ("yes" if per_task_kb <= TARGETS["kb_per_task"] else "no") if system == "taskhub" else "-"
            check = f"{system} memory per followed task, {low.tasks:,} → {high.tasks:,} tasks"
            figures = f"{per_task_kb:.1f} KB ({low.rss_mib:.1f} → {high.rss_mib:.1f} MiB)"
            lines.append(f"| {check} | {figures} | {goal} | {met} |")
        return ["", "| check | measured | goal | met |", "|---|---:|---:|---|", *lines] if lines else []

    @staticmethod
    def lateness_check(check: str, measured_ms: float, baseline_ms: float) -> str:
        """Lateness p99 no worse than 1.5x the aiohttp loop's in the same run (issue 18). Both are floored at
        1 ms, so that a sub-millisecond baseline does not turn noise into a ratio."""
        ratio = max(measured_ms, 1.0) / max(baseline_ms, 1.0)
        goal = TARGETS["lateness_ratio_to_aiohttp"]
        figures = f"{ratio:.2f} ({measured_ms} / {baseline_ms} ms)"
        return f"| {check} | {figures} | ≤ {goal} | {'yes' if ratio <= goal else 'no'} |"

    def scale_out_report(self) -> list[str]:
        if not self.scale_out_results:
            return []
        lines = [
            "",
            "Scale-out: two pollers follow the tasks together, pinned to cores "
            + ", ".join(str(core) for core in self.options.scale_out_cores)
            + ". taskhub: two `manage.py worker`s on one database; aiohttp: two bare loops of half the task ids"
            " each (the baseline with the same processes and cores as the two workers, so the ratio is the"
            " tracker's cost, not one process against two). Polls are told apart at the server by the client"
            " port of their connection.",
            "",
            "| tasks | poller | process | polls/s | tasks polled | leases held at the end | lateness p50 ms "
            "| lateness p99 ms | cpu ms/poll | tasks polled by both | early polls | load |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for result in self.scale_out_results:
            for poller in result.pollers:
                lines.append(
                    f"| {result.tasks:,} | {result.system} | {poller['name']} | {poller['polls_per_second']:,.0f} "
                    f"| {poller['tasks']:,} | {'-' if poller['held'] is None else f'{poller["held"]:,}'} "
                    f"| {poller['lateness_p50_ms']} | {poller['lateness_p99_ms']} | {poller['cpu_ms_per_poll']:.3f} "
                    f"| {result.by_both} | {result.early_polls} | {result.load:.1f} |"
                    + (f" {result.note}" if result.note else "")
                    + (f" {result.unattributed_polls} polls unattributed" if result.unattributed_polls else "")
                )
        taskhub = next((result for result in self.scale_out_results if result.system == "taskhub"), None)
        limit = next((result for result in self.scale_out_results if result.system == "aiohttp"), None)
        lines += ["", "| check | measured | goal | met |", "|---|---:|---:|---|"]
        if taskhub:
            where = f"{taskhub.tasks:,} tasks @ {taskhub.interval_ms} ms, two workers"
            counts = " / ".join(f"{poller['tasks']:,}" for poller in taskhub.pollers)
            every = sum(poller["tasks"] for poller in taskhub.pollers) - taskhub.by_both
            met = "yes" if taskhub.by_both == 0 and every == taskhub.tasks else "no"
            lines.append(
                f"| each task polled by one worker, {where} | {counts} tasks, {taskhub.by_both} by both "
                f"| {taskhub.tasks:,}, 0 by both | {met} |"
            )
            met = "yes" if taskhub.early_polls == 0 else "no"
            lines.append(f"| no task polled twice at once (early polls), {where} | {taskhub.early_polls} | 0 | {met} |")
            if limit and limit.lateness_p99_ms is not None:
                for poller in taskhub.pollers:
                    if poller["lateness_p99_ms"] is not None:
                        check = f"{poller['name']} lateness p99 / the aiohttp pair's, {where}"
                        lines.append(self.lateness_check(check, poller["lateness_p99_ms"], limit.lateness_p99_ms))
        return lines

    @staticmethod
    def met(ok: bool, binding: bool) -> str:
        return ("yes" if ok else "no") if binding else ("(yes)" if ok else "(no; goal is at saturation)")


def sizes(text: str) -> list[int]:
    return [int(part.replace("_", "").replace(",", "")) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tasks", type=sizes, default=[1000, 5000, 10000], help="task counts (1000,5000,10000)")
    parser.add_argument("--poll-interval-ms", type=int, default=1000, help="the server's pollIntervalMs (1000)")
    parser.add_argument("--duration", type=float, default=20.0, help="measurement window, seconds (default 20)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after every task was polled once (3)")
    parser.add_argument("--saturation-tasks", type=int, default=3000, help="tasks of the saturation run (0: none)")
    parser.add_argument("--saturation-interval-ms", type=int, default=1, help="its pollIntervalMs (default 1)")
    parser.add_argument("--no-saturation", dest="saturation_tasks", action="store_const", const=0)
    parser.add_argument("--systems", type=lambda text: text.split(","), default=["taskhub", "aiohttp", "sdk"])
    parser.add_argument(
        "--scale-out",
        type=int,
        default=0,
        help="tasks of the scale-out run: two workers on one database against two aiohttp loops of half each "
        "(0, the default: none; the issue's figure is 10000)",
    )
    parser.add_argument(
        "--scale-out-cores",
        type=lambda text: [int(core) for core in text.split(",")],
        default=[1, 1],
        help="the cores of the two pollers of the scale-out run (default 1,1: both beside each other, the fake "
        "server alone on its core)",
    )
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight of the baselines (default 32)")
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--results", default=str(BENCH / "RESULTS.md"))
    parser.add_argument("--no-record", dest="record", action="store_false", help="do not append to RESULTS.md")
    parser.add_argument("--label", default="", help="a word for the RESULTS.md heading (e.g. before, after)")
    parser.add_argument("--verbose", action="store_true", help="show the last lines each poller logged")
    parser.add_argument("--profile", default="", help="py-spy raw profile of the worker at saturation, to this file")
    # the child processes of the baselines
    parser.add_argument("--loop", choices=["aiohttp", "sdk"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--loop-tasks", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loop-part", default="0/1", help=argparse.SUPPRESS)  # poll ids[part::parts] of them
    options = parser.parse_args()
    if options.loop:
        run_child_loop(options)
        return
    Bench(options).run()


if __name__ == "__main__":
    main()
