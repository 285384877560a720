"""What `/metrics` reads from Postgres at each scrape: the same figures from whichever web process is scraped,
whatever the number of web and worker processes and hosts (so in Prometheus, aggregate them with max, not sum).

Every figure is exact as of the scrape's transaction (the leases as far as the workers' heartbeats tell, below),
and no read grows with the number of tasks kept (bench/metrics_scrape.py):
- tasks by server and status, input requests open and answered by server, poll rows by lease owner and failing
  ones by server and failures in a row: the few rows of changes that triggers keep (counts.py);
- the oldest open input request (the (state, created_at) index) and the oldest answer not yet delivered (the
  partial index of migration 0002): one index entry each;
- the job queue: procrastinate's jobs waiting or running by kind (its partial index on todo/doing: grows with the
  queue, not with the jobs kept), and per kind the oldest due job's wait since it was deferred or scheduled (the
  partial index of 0002, the first few jobs of each kind);
- leases held by worker: the owners' rows of changes, told apart by the workers' heartbeats (an owner whose
  heartbeat stopped holds nothing; one without a heartbeat row, such as a tracker run outside `manage.py worker`,
  has its unexpired leases counted);
- servers: reachable, last success, and their names (`taskhub_server_info`);
- tasks ended in the last 24 hours by outcome (outcomes.outcome_counts, the task list's and Home's rule): the
  partial finished_at index, growing with a day's work rather than with the tasks kept.
"""

from __future__ import annotations

import datetime
import logging
import time

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from taskhub import procrastinate_sql
from taskhub.observability import counts
from taskhub.observability.jobs import job_kind
from taskhub.tasks.models import Task
from taskhub.tasks.outcomes import outcome_counts

logger = logging.getLogger(__name__)

OLDEST_OPEN_SQL = "SELECT extract(epoch FROM now() - min(created_at)) FROM tasks_inputrequest WHERE state = 'open'"
OLDEST_ANSWER_SQL = (
    "SELECT extract(epoch FROM now() - min(answered_at)) FROM tasks_inputrequest WHERE state = 'answered'"
)
# Whether each lease owner's worker beats (see taskhub.worker.heartbeats): NULL for an owner without a row.
OWNERS_ALIVE_SQL = """
SELECT owner.name, beat.beat_at >= now() - %s * interval '1 second'
FROM unnest(%s::text[]) AS owner (name) LEFT JOIN worker_heartbeat AS beat ON beat.owner = owner.name
"""
UNEXPIRED_LEASES_SQL = """
SELECT lease_owner, count(*) FROM tasks_taskpoll WHERE lease_owner = ANY(%s) AND lease_expires_at > now() GROUP BY 1
"""
SERVERS_SQL = """
SELECT id, name, transport, enabled, unreachable_since IS NULL,
       extract(epoch FROM last_success_at), extract(epoch FROM now() - unreachable_since)
FROM servers_server
"""


class DatabaseCollector:
    """A prometheus-client collector: its figures are read at each `collect()`, in one transaction (folding the
    rows of changes of counts.py is its only write). If the database cannot be read, the scrape still serves the
    processes' own metrics, with `taskhub_metrics_database_up` 0."""

    def collect(self):
        started = time.perf_counter()
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                families = list(self._read(cursor))
        except DatabaseError:
            logger.warning("/metrics: the database figures could not be read", exc_info=True)
            families = []
        up = GaugeMetricFamily("taskhub_metrics_database_up", "1 if this scrape could read the database figures")
        up.add_metric([], 1 if families else 0)
        cost = GaugeMetricFamily(
            "taskhub_metrics_database_read_seconds", "How long this scrape took to read the database figures"
        )
        cost.add_metric([], time.perf_counter() - started)
        return [*families, up, cost]

    def _read(self, cursor):
        cursor.execute(SERVERS_SQL)
        servers = [row for row in cursor.fetchall() if row[3]]  # enabled ones
        tasks = GaugeMetricFamily("taskhub_tasks", "Tasks kept, by server and status", labels=["server", "status"])
        for server, status, count in counts.task_counts(cursor):
            tasks.add_metric([str(server), status], count)
        yield tasks
        yield _ended()

        yield from _inbox(cursor, [row[0] for row in servers])
        yield from _jobs(cursor)

        yield _leases(cursor)
        most_failures: dict[int, int] = {}
        for server, failures, _ in counts.poll_failure_counts(cursor):
            most_failures[server] = max(most_failures.get(server, 0), failures)
        yield from _servers(servers, most_failures)
        cursor.execute(
            "SELECT count(*) FROM servers_serverauthorization a JOIN servers_server s ON s.id = a.server_id"
            " WHERE a.needs_reauthorization_since IS NOT NULL AND s.oauth AND s.removed_at IS NULL"
        )
        reauthorization = GaugeMetricFamily(
            "taskhub_servers_needing_reauthorization",
            "Servers connected through OAuth whose token could not be refreshed: an admin must connect them again",
        )
        reauthorization.add_metric([], cursor.fetchone()[0])
        yield reauthorization


def _ended() -> GaugeMetricFamily:
    """Tasks that ended in the last 24 hours by outcome: the words and the rule of the task list's outcome filter
    and of Home's "Ended in the last 24 hours" (outcomes.outcome_counts); read from the partial finished_at index, so
    it grows with the day's work, not with the tasks kept."""
    ended = GaugeMetricFamily(
        "taskhub_tasks_ended_24h",
        "Tasks that ended in the last 24 hours, by outcome (as the task list's outcome filter and Home say it)",
        labels=["outcome"],
    )
    since = timezone.now() - datetime.timedelta(hours=24)
    for outcome, count in outcome_counts(Task.objects.filter(finished_at__gte=since)).items():
        ended.add_metric([outcome], count)
    return ended


def _inbox(cursor, server_ids: list[int]):
    """Per enabled server (0 included, so that a graph shows 0 rather than nothing), and the oldest of each state."""
    open_requests = GaugeMetricFamily(
        "taskhub_input_requests_open", "Input requests waiting for a person, by server", labels=["server"]
    )
    answered = GaugeMetricFamily(
        "taskhub_answers_undelivered",
        "Answers stored and not yet acknowledged by the server (tasks/update), by server",
        labels=["server"],
    )
    oldest = GaugeMetricFamily(
        "taskhub_input_request_oldest_age_seconds",
        "Age of the oldest input request still open (state=open), of the oldest answer not yet delivered"
        " (state=answered); 0 when there is none",
        labels=["state"],
    )
    by_state: dict[str, dict[int, int]] = {"open": {}, "answered": {}}
    for server, state, count in counts.input_request_counts(cursor):
        by_state[state][server] = count
    cursor.execute(OLDEST_OPEN_SQL)
    oldest.add_metric(["open"], float(cursor.fetchone()[0] or 0))
    cursor.execute(OLDEST_ANSWER_SQL)
    oldest.add_metric(["answered"], float(cursor.fetchone()[0] or 0))
    for server in sorted({*server_ids, *by_state["open"], *by_state["answered"]}):
        open_requests.add_metric([str(server)], by_state["open"].get(server, 0))
        answered.add_metric([str(server)], by_state["answered"].get(server, 0))
    yield from (open_requests, answered, oldest)


def _jobs(cursor):
    queued = GaugeMetricFamily(
        "taskhub_jobs", "Jobs waiting (todo) or running (doing), by kind", labels=["kind", "status"]
    )
    waiting = GaugeMetricFamily(
        "taskhub_job_oldest_wait_seconds",
        "How long the longest-waiting due job of each kind has waited since it was deferred or scheduled (of the"
        " first 10 due, in the order they were deferred, and the first 10 in the order they were scheduled)",
        labels=["kind"],
    )
    totals: dict[tuple[str, str], int] = {}
    waits: dict[str, float] = {}
    cursor.execute(procrastinate_sql.JOBS_SQL)
    rows = cursor.fetchall()
    for task_name, status, count in rows:
        kind = job_kind(task_name)
        totals[kind, status] = totals.get((kind, status), 0) + count
    cursor.execute(
        procrastinate_sql.JOB_WAITS_SQL, [sorted({task_name for task_name, status, _ in rows if status == "todo"})]
    )
    for task_name, wait in cursor.fetchall():
        kind = job_kind(task_name)
        waits[kind] = max(waits.get(kind, 0.0), float(wait or 0))
    for kind in ("launch", "answer_delivery", "cancel"):  # always present, so the dashboard shows a 0
        totals.setdefault((kind, "todo"), 0)
        waits.setdefault(kind, 0.0)
    for kind, status in totals:
        if status == "todo":  # due later: 0, as for a kind with nothing queued
            waits.setdefault(kind, 0.0)
    for (kind, status), count in sorted(totals.items()):
        queued.add_metric([kind, status], count)
    for kind, wait in sorted(waits.items()):
        waiting.add_metric([kind], wait)
    yield queued
    yield waiting


def _leases(cursor) -> GaugeMetricFamily:
    """A live worker renews its leases before they expire and a stopped one is taken over (its leases released) by
    the others once its heartbeat is TASKHUB_STALLED_WORKER_SECONDS old: so a worker whose heartbeat is live holds
    every row naming it, one whose heartbeat is too old holds none (even before the take-over), and only an owner
    without a heartbeat row has its rows' expiry read."""
    leases = GaugeMetricFamily(
        "taskhub_tracker_leases_held",
        "Live tasks whose poll row a worker holds now, by worker (0 once its heartbeat is older than"
        " TASKHUB_STALLED_WORKER_SECONDS)",
        labels=["worker"],
    )
    named = dict(counts.lease_counts(cursor))
    if not named:
        return leases
    cursor.execute(OWNERS_ALIVE_SQL, [settings.TASKHUB_STALLED_WORKER_SECONDS, list(named)])
    alive = dict(cursor.fetchall())
    held = {owner: count for owner, count in named.items() if alive.get(owner)}
    unknown = [owner for owner in named if alive.get(owner) is None]
    if unknown:
        cursor.execute(UNEXPIRED_LEASES_SQL, [unknown])
        held.update(cursor.fetchall())
    for owner, count in sorted(held.items()):
        if count:
            leases.add_metric([owner], count)
    return leases


def _servers(servers: list[tuple], failing: dict[int, int]):
    info = GaugeMetricFamily(
        "taskhub_server_info", "1 per registered server: its name and transport", labels=["server", "name", "transport"]
    )
    reachable = GaugeMetricFamily(
        "taskhub_server_reachable", "1 if the server answered its last request, 0 if not", labels=["server"]
    )
    last_success = GaugeMetricFamily(
        "taskhub_server_last_success_timestamp_seconds",
        "When the server last answered (Unix time); absent if it never did",
        labels=["server"],
    )
    unreachable_for = GaugeMetricFamily(
        "taskhub_server_unreachable_seconds",
        "How long the server has been unreachable; 0 if reachable",
        labels=["server"],
    )
    failures = GaugeMetricFamily(
        "taskhub_server_consecutive_failures",
        "The most polls in a row that failed for one of the server's live tasks",
        labels=["server"],
    )
    for server_id, name, transport, _, is_reachable, success_at, down_for in servers:
        server = str(server_id)
        info.add_metric([server, name, transport], 1)
        reachable.add_metric([server], 1 if is_reachable else 0)
        unreachable_for.add_metric([server], float(down_for or 0))
        if success_at is not None:
            last_success.add_metric([server], float(success_at))
        failures.add_metric([server], failing.get(server_id, 0))
    yield from (info, reachable, last_success, unreachable_for, failures)
