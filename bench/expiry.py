"""The expiry sweep: what the worker's minute job `expire_overdue_tasks` costs with many live tasks that have a TTL,
against the sweep as it was before b232104 in the same run (the baseline).

Fills a database of its own with INSERT … SELECT generate_series: `--live` live tasks (working and input_required)
with a TTL whose end lies ahead, written as the services write them (the server's createdAt as text, ttlMs, and
their end, Task.expires_at, by taskhub/tasks/ttl.py's rule, in SQL), and `--overdue` more past their end without a
change since. Then, alternating, `--rounds` times each: the sweep (worker/sweeps.py: expire_overdue, one indexed
statement for the live tasks past their end) and the baseline (every live task with a TTL read as a model, its
createdAt parsed in Python and compared: what expire_overdue did each minute before; it finds the same tasks and
expires none). The first sweep expires the overdue (its figure is printed apart); the rounds after find none, as
most minutes do. Reports the CPU and wall ms of each per run (this process: Django, psycopg; Postgres is another
process) and the ratio.

    uv run python bench/expiry.py                                  # 400,000 live tasks, 100 overdue, 5 rounds (~1 min)
    uv run python bench/expiry.py --live 20000 --no-record         # a quick look

Postgres: --database-url (default $BENCH_EXPIRY_DATABASE_URL or postgres://postgres@127.0.0.1:5432/taskhub_bench_expiry),
dropped and created by the benchmark, dropped again at the end.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import set_database
from livestack import append_results, load, results_header

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/taskhub_bench_expiry"
GRACE = datetime.timedelta(seconds=60)  # worker/sweeps.py's EXPIRY_GRACE, as the baseline compares


def fill(live: int, overdue: int) -> None:
    from django.contrib.auth.models import User
    from django.db import connection

    from taskhub.servers.models import Server, Transport

    server = Server.objects.create(name="bench-expiry", transport=Transport.HTTP, url="http://127.0.0.1:9/bench")
    user = User.objects.create_user("bench-expiry", password=None)
    with connection.cursor() as cursor:
        # i <= live: created i seconds ago with a TTL of a day past that; the others created two hours ago with a
        # TTL of a minute, unchanged since (updated_at = their creation).
        cursor.execute(
            """
            INSERT INTO tasks_task (id, tool, arguments, remote_task_id, status, status_message, ttl_ms,
                poll_interval_ms, remote_created_at, remote_last_updated_at, expires_at, created_at, updated_at,
                server_id, launched_by_id, launch_attempts, launch_last_error, launched_via_label)
            SELECT gen_random_uuid(), 'tool', '{}'::jsonb, 'remote-' || i,
                CASE WHEN i %% 2 = 0 THEN 'working' ELSE 'input_required' END, '', t.ttl_ms, 2000,
                to_char(c.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), '',
                c.at + t.ttl_ms * interval '1 millisecond', c.at, c.at, %s, %s, 0, '', ''
            FROM generate_series(1, %s) AS i,
                LATERAL (SELECT CASE WHEN i <= %s THEN now() - i * interval '1 second'
                                     ELSE now() - interval '2 hours' END AS at) AS c,
                LATERAL (SELECT CASE WHEN i <= %s THEN i::bigint * 1000 + 86400000 ELSE 60000 END AS ttl_ms) AS t
            """,
            [server.pk, user.pk, live + overdue, live, live],
        )
        cursor.execute("VACUUM ANALYZE tasks_task")


def sweep_before(now: datetime.datetime) -> list:
    """What expire_overdue found each minute before b232104 (its read and its test), expiring none."""
    from taskhub.tasks.models import LIVE_STATUSES, Task

    candidates = (
        Task.objects.filter(status__in=LIVE_STATUSES, ttl_ms__isnull=False)
        .exclude(remote_created_at="")
        .only("id", "ttl_ms", "remote_created_at", "updated_at", "status")
    )
    found = []
    for task in candidates.iterator():
        try:
            created = datetime.datetime.fromisoformat(task.remote_created_at)
        except ValueError:
            continue
        if created.tzinfo is None:
            created = created.replace(tzinfo=datetime.UTC)
        deadline = created + datetime.timedelta(milliseconds=task.ttl_ms)
        if now < deadline + GRACE or task.updated_at > deadline:
            continue
        found.append(task)
    return found


def timed(function) -> tuple[float, float, object]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    value = function()
    return (time.process_time() - cpu0) * 1000, (time.perf_counter() - wall0) * 1000, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", type=int, default=400_000, help="live tasks with a TTL whose end lies ahead")
    parser.add_argument("--overdue", type=int, default=100, help="live tasks past their end, unchanged since")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_EXPIRY_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()

    load_start = load()
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DEBUG": "false",
    }
    set_database(args.database_url, create=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    os.environ.update({key: env[key] for key in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "DEBUG")})
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    logging.getLogger("taskhub.tasks.services").setLevel(logging.ERROR)  # each expired task's line
    from django.db import connection
    from django.utils import timezone

    from taskhub.worker.sweeps import expire_overdue

    try:
        started = time.monotonic()
        fill(args.live, args.overdue)
        print(f"filled {args.live:,} live tasks and {args.overdue:,} overdue in {time.monotonic() - started:.1f} s")
        found_before = len(sweep_before(timezone.now()))
        first_cpu, first_wall, expired = timed(lambda: expire_overdue(now=timezone.now()))
        if len(expired) != args.overdue or found_before != args.overdue:
            raise SystemExit(
                f"expected {args.overdue} overdue: the sweep expired {len(expired)}, the baseline found {found_before}"
            )
        now_figures: dict[str, list[float]] = {"cpu": [], "wall": []}
        before_figures: dict[str, list[float]] = {"cpu": [], "wall": []}
        for _ in range(args.rounds):
            for figures, function in ((now_figures, expire_overdue), (before_figures, sweep_before)):
                cpu, wall, found = timed(lambda function=function: function(now=timezone.now()))
                assert not found, "nothing is overdue after the first sweep"
                figures["cpu"].append(cpu)
                figures["wall"].append(wall)
        connection.close()
    finally:
        set_database(args.database_url, create=False)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    median = statistics.median
    lines = [
        *results_header(
            f"Expiry sweep: {args.live:,} live tasks with a TTL",
            "uv run python bench/expiry.py " + " ".join(sys.argv[1:]),
            load_start,
        ),
        f"- commit {commit.strip()}",
        f"- {args.overdue} overdue, expired by the first sweep in {first_cpu:.1f} ms of CPU ({first_wall:.1f} ms wall);"
        f" then {args.rounds} rounds of each, alternating, none overdue",
        "",
        "| sweep | CPU ms per run (median) | wall ms per run (median) | max wall ms |",
        "|---|---:|---:|---:|",
        f"| expire_overdue (Task.expires_at, index task_live_expires) | {median(now_figures['cpu']):.2f} | "
        f"{median(now_figures['wall']):.2f} | {max(now_figures['wall']):.2f} |",
        f"| before b232104 (every live task with a TTL read and parsed; the baseline) | "
        f"{median(before_figures['cpu']):.1f} | {median(before_figures['wall']):.1f} | "
        f"{max(before_figures['wall']):.1f} |",
        "",
        f"- the sweep takes {median(now_figures['wall']) / median(before_figures['wall']):.4f}x the baseline's wall "
        f"time, {median(now_figures['cpu']) / max(median(before_figures['cpu']), 1e-9):.4f}x its CPU",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        append_results(args.results, text)


if __name__ == "__main__":
    main()
