"""The audit trail at scale (issue 36): what progress costs it, before and after, and how fast its page answers.

1. Progress. `--tasks` live tasks (default 1,000) each report a new status message every simulated second for
   `--seconds` (default 600: ten minutes), applied through the service (services.apply_snapshot, one call per task
   and second, no waiting: the clock is simulated). Run twice in the same database and process: "before" with the old
   behaviour (every status-message change an audit row, task.updated: following.PROGRESS_FIELDS emptied), "after" as
   shipped (the task's progress history). Reports, for each, the rows and bytes the audit table (all its partitions,
   indexes included) gained, and the progress history's rows and bytes. `--workers` processes share the tasks.
2. The Audit page at `--rows` audit rows (default 10,000,000): filled with INSERT … SELECT generate_series over the
   last 12 months (5% people's actions, the rest the worker's; the chain trigger off for the fill, hashes filled
   alike), then timed in-process through Django's test Client (DEBUG off, an admin signed in), `--requests` per
   page after warm-ups: the page as it opens (people's actions), taskhub's own, everything, one task, one action,
   page 50. Reports p50/p95/max ms against the goal, p95 ≤ 150 ms.
3. Between the two, what the chain costs writers: 1 and 4 processes each writing audit rows (one transaction per row,
   through record_event) for `--writer-seconds`, as shipped (rows written unsealed, one sealer process sealing them
   into the chain every second meanwhile, as the worker's sweep does every minute, and whatever is left once they
   stop) and with every trigger
   off (no chain at all): rows per second, and the rows sealed meanwhile. Before audit migration 0011 the chain was
   made inside the writing transaction, under a lock per month held from a writer's row to its commit.

    uv run python bench/audit.py                                             # full scale (see README: Benchmarks)
    uv run python bench/audit.py --tasks 10 --seconds 20 --rows 20000 --requests 5      # a quick look

Postgres: --database-url (default $BENCH_AUDIT_DATABASE_URL or postgres://postgres@127.0.0.1:5432/taskhub_bench_audit),
dropped and created by the benchmark (--keep leaves it); a superuser (the fill turns triggers off).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from benchlib import machine, percentile, set_database

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench_audit"
GOAL_P95_MS = 150.0


def django_setup(database_url: str) -> None:
    os.environ.update(
        {
            "DATABASE_URL": database_url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "ALLOWED_HOSTS": "testserver",
            "DEBUG": "false",
        }
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


# --- 1. progress ----------------------------------------------------------------------------------------------------


def audit_size() -> tuple[int, int, int, int]:
    """Rows and bytes (tables and indexes) of the audit trail, then of the progress history."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM audit_auditevent),"
            " (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('audit_auditevent')),"
            " (SELECT count(*) FROM tasks_progressmessage),"
            " pg_total_relation_size('tasks_progressmessage')"
        )
        return cursor.fetchone()


def make_live_tasks(count: int, label: str) -> list:
    from django.utils import timezone

    from taskhub.mcp.client import TaskCreated
    from taskhub.mcp.wire import TaskSnapshot
    from taskhub.servers.models import Server, Transport
    from taskhub.tasks import services

    server = Server.objects.create(
        name=f"bench-{label}",
        transport=Transport.HTTP,
        url="http://127.0.0.1:9/mcp",
        tools=[{"name": "long", "inputSchema": {"type": "object"}}],
        discovered_at=timezone.now(),
    )
    ids = []
    for n in range(count):
        task = services.launch(server=server, tool="long", arguments={}, user=None)
        created = TaskSnapshot.model_validate({"taskId": f"{label}-{n}", "status": "working", "ttlMs": 3_600_000})
        ids.append(services.record_launch_outcome(task=task, outcome=TaskCreated(task=created)).pk)
    return ids


def report_progress(database_url: str, task_ids: list, seconds: int, old_behaviour: bool) -> None:
    """One process's share: every task reports each second's message through the service."""
    django_setup(database_url)
    from taskhub.mcp.wire import TaskSnapshot
    from taskhub.tasks import services
    from taskhub.tasks.models import Task
    from taskhub.tasks.services import following

    if old_behaviour:
        following.PROGRESS_FIELDS = frozenset()  # every status message an audit row (task.updated), as before
    remote = dict(Task.objects.filter(pk__in=task_ids).values_list("pk", "remote_task_id"))
    for second in range(seconds):
        for task_id in task_ids:
            wire = {"taskId": remote[task_id], "status": "working", "ttlMs": 3_600_000}
            wire["statusMessage"] = f"{seconds - second} s of {seconds} s"
            services.apply_snapshot(task=Task(pk=task_id), snapshot=TaskSnapshot.model_validate(wire))


def progress_phase(args, label: str, *, old_behaviour: bool) -> dict:
    from django.db import connection

    ids = make_live_tasks(args.tasks, label)
    connection.close()
    before = audit_size()
    connection.close()
    started = time.monotonic()
    shares = [ids[n :: args.workers] for n in range(args.workers)]
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=report_progress, args=(args.database_url, share, args.seconds, old_behaviour))
        for share in shares
        if share
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        if worker.exitcode:
            raise SystemExit(f"a progress worker failed ({worker.exitcode})")
    after = audit_size()
    return {
        "label": label,
        "seconds": time.monotonic() - started,
        "audit_rows": after[0] - before[0],
        "audit_bytes": after[1] - before[1],
        "history_rows": after[2] - before[2],
        "history_bytes": after[3] - before[3],
    }


# --- the chain's cost to writers ------------------------------------------------------------------------------------


def write_events(database_url: str, seconds: float, chained: bool, results) -> None:
    """One writer: a transaction per audit row, as services write them, for `seconds`; puts how many it wrote."""
    django_setup(database_url)
    from django.db import connection, transaction

    from taskhub.audit.services import record_event

    if not chained:
        with connection.cursor() as cursor:  # every trigger off for this session (a superuser's): no chain
            cursor.execute("SET session_replication_role = replica")
    written, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        with transaction.atomic():
            record_event(action="server.updated", data={"writer": os.getpid(), "n": written})
        written += 1
    results.put(written)


def seal_meanwhile(database_url: str, stop, results) -> None:
    """The worker's sweep, once a second (the worker's is once a minute): seals what the writers committed until
    told to stop; puts how many."""
    django_setup(database_url)
    from taskhub.audit import chain

    sealed = 0
    while not stop.wait(1.0):
        sealed += chain.seal_committed()
    results.put(sealed)


def writers_phase(args, *, writers: int, chained: bool) -> dict:
    context = multiprocessing.get_context("spawn")
    results, sealer_results, stop = context.Queue(), context.Queue(), context.Event()
    processes = [
        context.Process(target=write_events, args=(args.database_url, args.writer_seconds, chained, results))
        for _ in range(writers)
    ]
    sealer = None
    if chained:
        from taskhub.audit import chain

        chain.seal_committed()  # the rows of the runs before (no trigger made them sealed): not this run's work
        sealer = context.Process(target=seal_meanwhile, args=(args.database_url, stop, sealer_results))
    for process in processes + ([sealer] if sealer else []):
        process.start()
    written = sum(results.get() for _ in processes)
    for process in processes:
        process.join()
    phase = {"writers": writers, "chained": chained, "per_second": written / args.writer_seconds}
    if sealer is not None:
        stop.set()
        phase["sealed_meanwhile"] = sealer_results.get()
        sealer.join()
        phase["sealed_after"] = chain.seal_committed()
        phase["whole"] = all(month.whole for month in chain.verify_all())
    return phase


# --- 2. the page at scale -------------------------------------------------------------------------------------------


def fill_audit(rows: int) -> dict:
    from django.contrib.auth.models import Group, User
    from django.db import connection

    from taskhub.accounts.groups import ADMINS

    users = [User.objects.create_user(f"user{n}", password=None) for n in range(10)]
    admin = User.objects.create_user("bench-admin", password=None)
    admin.groups.add(Group.objects.get(name=ADMINS))
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT audit_ensure_month((date_trunc('month', now(), 'UTC') - n * interval '1 month')::date)"
            " FROM generate_series(0, 12) AS n"
        )
        cursor.execute(
            "SELECT indexname, replace(indexdef, ' ON ONLY ', ' ON ') FROM pg_indexes"
            " WHERE tablename = 'audit_auditevent' AND indexname <> 'audit_auditevent_pkey'"
        )
        indexes = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        cursor.execute("SET session_replication_role = replica")  # the chain trigger: a fill, not a history
        cursor.execute(
            """
            INSERT INTO audit_auditevent (id, time, actor_label, action, data, actor_id, server_id, task_id,
                seq, prev_hash, hash)
            SELECT i, now() - (i * (365 * 86400.0 / %(rows)s)) * interval '1 second',
                CASE WHEN i %% 20 = 0 THEN 'user' || (i %% 10) ELSE 'worker' END,
                (ARRAY['task.status_changed', 'task.launch_answered', 'input.delivered', 'task.server_logged'])
                    [1 + i %% 4],
                jsonb_build_object('from', 'working', 'to', 'completed', 'source', 'poll', 'n', i),
                CASE WHEN i %% 20 = 0 THEN (%(users)s::int[])[1 + i %% 10] END,
                1 + i %% 5, md5((i / 4)::text)::uuid,
                i, sha256(int8send(i - 1)), sha256(int8send(i))
            FROM generate_series(1, %(rows)s) AS i
            """,
            {"rows": rows, "users": [user.pk for user in users]},
        )
        cursor.execute("SET session_replication_role = origin")
        cursor.execute("SELECT setval('audit_auditevent_id_seq', %s)", [rows + 1])
        cursor.execute("SELECT setval('audit_auditevent_seq_seq', %s)", [rows + 1])
        cursor.execute("SET maintenance_work_mem = '512MB'")
        for _, definition in indexes:
            cursor.execute(definition)
        cursor.execute("ANALYZE audit_auditevent")
        cursor.execute("SELECT task_id FROM audit_auditevent WHERE id = %s", [rows // 2])
        task_id = cursor.fetchone()[0]
    return {"admin": admin, "task_id": task_id, "fill_seconds": time.monotonic() - started}


def time_pages(data: dict, *, requests: int, warmup: int) -> list[tuple[str, list[float]]]:
    from django.test import Client

    client = Client()
    client.force_login(data["admin"])
    pages = [
        ("as it opens (people's actions)", "/audit/"),
        ("taskhub's own", "/audit/?made_by=system"),
        ("everything", "/audit/?made_by=all"),
        ("one task", f"/audit/?made_by=all&task={data['task_id']}"),
        ("one action", "/audit/?made_by=all&action=input.delivered"),
        ("page 50 (people's)", "/audit/?page=50"),
    ]
    timings = []
    for label, path in pages:
        for _ in range(warmup):
            assert client.get(path).status_code == 200
        took = []
        for _ in range(requests):
            started = time.perf_counter()
            response = client.get(path)
            took.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code)
        timings.append((label, took))
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=600, help="simulated seconds of progress per task")
    parser.add_argument("--workers", type=int, default=2, help="processes applying the progress")
    parser.add_argument("--writer-seconds", type=float, default=20.0, help="seconds of each concurrent-writer run")
    parser.add_argument("--rows", type=int, default=10_000_000, help="audit rows for the page's timing")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_AUDIT_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--phases",
        default="progress,writers,pages",
        help="which of progress, writers, pages to run (comma-separated; the progress counts need no quiet machine)",
    )
    args = parser.parse_args()
    wanted = set(args.phases.split(","))
    if unknown := wanted - {"progress", "writers", "pages"}:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    print(f"audit at scale: {' '.join(sys.argv[1:]) or 'defaults'}; load {os.getloadavg()[0]:.1f}", flush=True)

    set_database(args.database_url, create=True)
    env = {**os.environ, "DATABASE_URL": args.database_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env={**env, "DEBUG": "false"}, check=True)
    django_setup(args.database_url)
    try:
        phases, writing, timings = [], [], []
        if "progress" in wanted:
            phases = [
                progress_phase(args, "before", old_behaviour=True),
                progress_phase(args, "after", old_behaviour=False),
            ]
        if "writers" in wanted:
            writing = [
                writers_phase(args, writers=writers, chained=chained) for writers in (1, 4) for chained in (False, True)
            ]
        if "pages" in wanted:
            data = fill_audit(args.rows)
            timings = time_pages(data, requests=args.requests, warmup=args.warmup)
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            set_database(args.database_url, create=False)

    print(f"\n## Audit trail (issue 36) — {time.strftime('%Y-%m-%d')}\n\n- machine: {machine()}")
    print(f"- command: uv run python bench/audit.py {' '.join(sys.argv[1:])}\n")
    print(f"- load at the end: {os.getloadavg()[0]:.1f}\n")
    if phases:
        print_progress(args, phases)
    if writing:
        print_writers(args, writing)
    if timings:
        print_pages(args, data, timings)


def print_progress(args, phases) -> None:
    print(f"{args.tasks:,} tasks reporting a new status message every second for {args.seconds:,} s (simulated):\n")
    print("| behaviour | audit rows added | audit bytes added | progress history rows | history bytes | took |")
    print("|---|---:|---:|---:|---:|---:|")
    for phase in phases:
        print(
            f"| {phase['label']} | {phase['audit_rows']:,} | {phase['audit_bytes'] / 2**20:,.1f} MiB"
            f" | {phase['history_rows']:,} | {phase['history_bytes'] / 2**20:,.1f} MiB | {phase['seconds']:.0f} s |"
        )


def print_writers(args, writing) -> None:
    print(f"\nAudit rows written, one transaction each, for {args.writer_seconds:g} s:\n")
    print("| writers | no chain (triggers off) | as shipped (sealed after commit) | sealed meanwhile, after | chain |")
    print("|---:|---:|---:|---:|---|")
    for plain, chained in zip(writing[::2], writing[1::2], strict=True):
        print(
            f"| {plain['writers']} | {plain['per_second']:,.0f} rows/s | {chained['per_second']:,.0f} rows/s"
            f" | {chained['sealed_meanwhile']:,}, {chained['sealed_after']:,}"
            f" | {'whole' if chained['whole'] else 'BROKEN'} |"
        )


def print_pages(args, data, timings) -> None:
    filled = f"filled in {data['fill_seconds']:.0f} s"
    print(f"\nThe Audit page at {args.rows:,} rows ({filled}), goal p95 ≤ {GOAL_P95_MS:g} ms:\n")
    print("| page | p50 ms | p95 ms | max ms | goal |")
    print("|---|---:|---:|---:|---|")
    for label, took in timings:
        p95 = percentile(took, 0.95)
        verdict = "met" if p95 <= GOAL_P95_MS else "MISSED"
        print(f"| {label} | {percentile(took, 0.5):.1f} | {p95:.1f} | {max(took):.1f} | {verdict} |")


if __name__ == "__main__":
    main()
