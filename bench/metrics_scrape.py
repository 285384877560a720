"""What one scrape of /metrics costs with 100,000 tasks (issue 19: "at most a few milliseconds"): the whole request
and, apart, the reads of Postgres it makes (tasks by server and status, the inbox, the job queue, leases, server
health: taskhub/observability/collectors.py).

Fills a database of its own as bench/pages.py does (100,000 tasks across 5 servers, statuses mixed, 20,000 open
input requests), then adds what the scrape reads beyond it: a poll row per live task (40,000; leases held by
4 workers with live heartbeats, some failing), 500 answers not yet delivered, 1,000 queued jobs with their
`deferred` events, and --churn status changes made one task at a time (each leaves two rows for the task counts to
fold, as a busy day would). Then times, in-process through Django's test Client (DEBUG off, single-process
metrics), the first scrape (it folds the churn) and N more after W warm-ups: p50/p95/max ms of the request, of its
database reads (the `taskhub_metrics_database_read_seconds` it reports) and the SQL statements per scrape; and
EXPLAIN (ANALYZE, BUFFERS) of each of the collector's queries.

    uv run python bench/metrics_scrape.py                          # 100,000 tasks, 50 scrapes
    uv run python bench/metrics_scrape.py --tasks 10000 --open-requests 2000 --scrapes 10 --no-record   # a look

Postgres: --database-url (default $BENCH_METRICS_DATABASE_URL or
postgres://postgres@127.0.0.1:5432/taskhub_bench_metrics); that database is dropped and created by the benchmark
(--keep leaves it for a look afterwards).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchlib import machine, percentile, set_database

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench_metrics"
TOKEN = "bench-metrics-token"
GOAL_MS = 5.0  # "a few milliseconds", for the database reads


def add_scrape_data(answered: int, jobs: int, churn: int) -> dict:
    """Poll rows, undelivered answers, queued jobs and status churn on top of bench/pages.py's fill."""
    from django.db import connection

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO tasks_taskpoll (task_id, next_poll_at, lease_owner, lease_expires_at, consecutive_failures)
            SELECT id, now() + (row_number() OVER () % 60) * interval '1 second',
                   CASE WHEN row_number() OVER () % 3 = 0 THEN 'worker-' || (row_number() OVER () % 4) ELSE '' END,
                   CASE WHEN row_number() OVER () % 3 = 0 THEN now() + interval '30 seconds' END,
                   CASE WHEN row_number() OVER () % 50 = 0 THEN 3 ELSE 0 END
            FROM tasks_task WHERE status IN ('working', 'input_required')
            """
        )
        # The 4 workers' heartbeats, as live workers keep them (dated past the run rather than beaten by a thread).
        cursor.execute(
            """
            INSERT INTO worker_heartbeat (owner, started_at, beat_at)
            SELECT 'worker-' || n, now(), now() + interval '1 day' FROM generate_series(0, 3) AS n
            """
        )
        cursor.execute(
            """
            UPDATE tasks_inputrequest SET state = 'answered', answered_at = now() - interval '2 minutes',
                answer = '{"action": "decline"}'
            WHERE id IN (SELECT id FROM tasks_inputrequest WHERE state = 'open' ORDER BY id LIMIT %s)
            """,
            [answered],
        )
        cursor.execute(
            """
            WITH queued AS (
                INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args, status)
                SELECT 'default', (ARRAY['taskhub.launch_task', 'taskhub.deliver_answer', 'taskhub.deliver_cancel'])[
                    1 + i %% 3], 'bench-' || i, jsonb_build_object('n', i), 'todo'
                FROM generate_series(1, %s) AS i RETURNING id
            )
            INSERT INTO procrastinate_events (job_id, type, at)
            SELECT id, 'deferred', now() - (id %% 120) * interval '1 second' FROM queued
            """,
            [jobs],
        )
        cursor.execute("SELECT id FROM tasks_task WHERE status = 'working' ORDER BY id LIMIT %s", [churn])
        ids = [row[0] for row in cursor.fetchall()]
        for task_id in ids:  # one statement per task, as the tracker's applies are
            cursor.execute("UPDATE tasks_task SET status = 'completed' WHERE id = %s", [task_id])
        cursor.execute("SELECT count(*) FROM observability_taskstatusdelta")
        delta_rows = cursor.fetchone()[0]
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return {"seconds": time.monotonic() - started, "delta_rows": delta_rows}


def scrape(client) -> tuple[float, float, int]:
    """One scrape: request ms, its database reads in ms (as it reports them), and its size."""
    started = time.perf_counter()
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, response.status_code
    text = response.content.decode()
    line = next(line for line in text.splitlines() if line.startswith("taskhub_metrics_database_read_seconds "))
    return elapsed, float(line.split()[1]) * 1000, len(response.content)


def explain_all() -> list[tuple[str, str]]:
    from django.db import connection

    from taskhub import procrastinate_sql
    from taskhub.observability import collectors, counts

    jobs_todo = ["taskhub.launch_task", "taskhub.deliver_answer", "taskhub.deliver_cancel"]
    workers = [f"worker-{n}" for n in range(4)]
    queries = [
        ("tasks", counts.sum_sql(*counts.TASKS), []),
        ("input requests", counts.sum_sql(*counts.INPUT_REQUESTS), []),
        ("oldest open", collectors.OLDEST_OPEN_SQL, []),
        ("oldest answer", collectors.OLDEST_ANSWER_SQL, []),
        ("jobs", procrastinate_sql.JOBS_SQL, []),
        ("job waits", procrastinate_sql.JOB_WAITS_SQL, [jobs_todo]),
        ("leases", counts.sum_sql(*counts.LEASES), []),
        ("lease owners alive", collectors.OWNERS_ALIVE_SQL, [10.0, workers]),
        ("poll failures", counts.sum_sql(*counts.POLL_FAILURES), []),
        ("servers", collectors.SERVERS_SQL, []),
    ]
    plans = []
    with connection.cursor() as cursor:
        for label, sql, params in queries:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            plans.append((label, "\n".join(row[0] for row in cursor.fetchall())))
    return plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--open-requests", type=int, default=20_000)
    parser.add_argument("--answered", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1_000)
    parser.add_argument("--churn", type=int, default=2_000, help="status changes made one task at a time")
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_METRICS_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    command = "uv run python bench/metrics_scrape.py " + " ".join(sys.argv[1:])
    load_start = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"/metrics at scale: {args.tasks:,} tasks; machine shared (load {load_start})", flush=True)
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "ALLOWED_HOSTS": "testserver",
        "DEBUG": "false",
        "TASKHUB_METRICS_TOKEN": TOKEN,
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    set_database(args.database_url, create=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    os.environ.update({key: env[key] for key in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "ALLOWED_HOSTS", "DEBUG")})
    os.environ["TASKHUB_METRICS_TOKEN"] = TOKEN
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from pages import fill

    try:
        filled = fill(args.tasks, args.open_requests)
        extra = add_scrape_data(args.answered, args.jobs, args.churn)
        print(
            f"filled in {filled['fill_seconds'] + extra['seconds']:.1f} s; {extra['delta_rows']:,} rows of task"
            " status changes to fold",
            flush=True,
        )
        client = Client()
        first_ms, first_db_ms, _ = scrape(client)
        for _ in range(args.warmup):
            scrape(client)
        requests, reads, size = [], [], 0
        for _ in range(args.scrapes):
            elapsed, db_ms, size = scrape(client)
            requests.append(elapsed)
            reads.append(db_ms)
        with CaptureQueriesContext(connection) as captured:
            scrape(client)
        plans = explain_all()
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            set_database(args.database_url, create=False)

    def row(label: str, values: list[float]) -> str:
        return f"| {label} | {statistics.median(values):.2f} | {percentile(values, 0.95):.2f} | {max(values):.2f} |"

    verdict = "met" if percentile(reads, 0.95) <= GOAL_MS else "NOT met"
    report = "\n".join(
        [
            f"## /metrics scrape cost — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "",
            f"`{command.strip()}` on {machine()}; load at start {load_start}. {args.tasks:,} tasks, "
            f"{args.open_requests:,} input requests ({args.answered} answered, undelivered), {args.jobs:,} queued "
            f"jobs, {extra['delta_rows']:,} task status change rows before the first scrape. {args.scrapes} scrapes "
            f"after {args.warmup} warm-ups; {len(captured.captured_queries)} SQL statements per scrape; "
            f"{size:,} bytes.",
            "",
            "| ms | p50 | p95 | max |",
            "|---|---|---|---|",
            row("whole request", requests),
            row("its database reads", reads),
            "",
            f"First scrape (folds the status changes): {first_ms:.1f} ms, of which database {first_db_ms:.1f} ms. "
            f"Goal (database reads p95 ≤ {GOAL_MS:.0f} ms): {verdict}.",
            "",
        ]
    )
    print(report)
    for label, plan in plans:
        print(f"-- {label}\n{plan}\n")
    if not args.no_record:
        with open(args.results, "a") as results:
            results.write("\n" + report)
        print(f"appended to {args.results}")


if __name__ == "__main__":
    main()
