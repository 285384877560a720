"""The process-local instruments and the one-line calls that feed them.

Every daphne and worker process counts in its own memory, or, with PROMETHEUS_MULTIPROC_DIR set (several processes
on one host), in files of its own in that directory, which `/metrics` of any web process on the host sums
(prometheus-client's multiprocess mode). PROMETHEUS_MULTIPROC_DIR must be set in the environment of every process
before it starts, point to one directory per host, and be emptied when the whole host's taskhub restarts.

What is kept in Postgres (tasks by status, the inbox, the job queue, leases, server health) is not counted here:
`collectors.py` reads it at each scrape, so it is right whatever the number of processes and hosts.

Server labels are server ids (`taskhub_server_info` maps them to names). The calls never raise: a metric must
never break the work it counts.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime

MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip() or None
if MULTIPROCESS_DIR is not None:  # prometheus-client writes there from the first metric on
    os.makedirs(MULTIPROCESS_DIR, exist_ok=True)

from prometheus_client import Counter, Gauge, Histogram  # noqa: E402 - after the directory exists

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Answer stored → tasks/update acknowledged: milliseconds when all is well, hours across a server outage.
DELIVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 7200.0)
JOB_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

HTTP_REQUESTS = Counter(
    "taskhub_http_requests_total", "HTTP requests answered, by view and status", ["method", "view", "status"]
)
HTTP_DURATION = Histogram(
    "taskhub_http_request_duration_seconds",
    "Time to answer an HTTP request, by view",
    ["method", "view"],
    buckets=LATENCY_BUCKETS,
)
DB_QUERIES = Counter("taskhub_db_queries_total", "SQL statements sent to the database", ["alias"])
POLLS = Counter("taskhub_tracker_polls_total", "tasks/get polls made by the tracker", ["server"])
POLL_FAILURES = Counter(
    "taskhub_tracker_poll_failures_total",
    "Polls that brought no usable snapshot (unreachable, not_found, protocol, error)",
    ["server", "reason"],
)
POLL_LATENESS = Histogram(
    "taskhub_tracker_poll_lateness_seconds",
    "How long after its due time a poll was sent",
    ["server"],
    buckets=LATENESS_BUCKETS,
)
PROTOCOL_ERRORS = Counter(
    "taskhub_tracker_protocol_errors_total",
    "Answers and notifications from a server that the protocol does not allow",
    ["server", "source"],
)
SUBSCRIPTIONS_OPEN = Gauge(
    "taskhub_tracker_subscriptions_open",
    "subscriptions/listen streams open now",
    ["server"],
    multiprocess_mode="livesum",
)
JOB_ATTEMPTS = Counter(
    "taskhub_job_attempts_total", "Job runs, by kind and outcome (succeeded, retried, failed)", ["kind", "outcome"]
)
JOB_DURATION = Histogram("taskhub_job_duration_seconds", "How long a job ran", ["kind"], buckets=JOB_BUCKETS)
ANSWER_DELIVERY = Histogram(
    "taskhub_answer_delivery_seconds",
    "From an answer stored to its tasks/update acknowledged by the server",
    buckets=DELIVERY_BUCKETS,
)
LIVE_PUSHES = Counter(
    "taskhub_live_pushes_total", "Task changes published to the channel layer (sent or dropped)", ["outcome"]
)
PROCESSES = Gauge(
    "taskhub_process_up",
    "1 for each running taskhub process, by kind (web, worker)",
    ["kind"],
    multiprocess_mode="liveall",
)


def _never_raises(function):
    def guarded(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception:
            logger.warning("metric %s not recorded", function.__name__, exc_info=True)
            return None

    guarded.__name__ = function.__name__
    guarded.__doc__ = function.__doc__
    return guarded


# --- the one-line calls ----------------------------------------------------------------------------------------


@_never_raises
def process_started(kind: str) -> None:
    PROCESSES.labels(kind).set(1)


@_never_raises
def http_request(method: str, view: str, status: int, seconds: float) -> None:
    method = method if method in HTTP_METHODS else "other"
    HTTP_REQUESTS.labels(method, view, str(status)).inc()
    HTTP_DURATION.labels(method, view).observe(seconds)


# Each server's poll counter and lateness histogram, looked up once: `labels()` per poll was a few percent of
# the tracker's CPU at saturation (a lock and a tuple key each time). The children live as long as the metrics.
_poll_metrics: dict[int, tuple] = {}


@_never_raises
def poll_sent(server_id: int, lateness_seconds: float) -> None:
    """A poll leaves now, `lateness_seconds` after its due time (negative: early, counted as 0)."""
    children = _poll_metrics.get(server_id)
    if children is None:
        children = _poll_metrics[server_id] = (POLLS.labels(str(server_id)), POLL_LATENESS.labels(str(server_id)))
    children[0].inc()
    children[1].observe(max(lateness_seconds, 0.0))


@_never_raises
def poll_failed(server_id: int, reason: str) -> None:
    POLL_FAILURES.labels(str(server_id), reason).inc()
    if reason == "protocol":
        PROTOCOL_ERRORS.labels(str(server_id), "poll").inc()


@_never_raises
def notification_problem(server_id: int) -> None:
    PROTOCOL_ERRORS.labels(str(server_id), "notification").inc()


@contextlib.asynccontextmanager
async def subscription_open(server_id: int, subscription) -> AsyncIterator:
    """`async with subscription_open(server_id, client.listen(ids)) as s:` counts the subscription while open."""
    async with subscription as entered:
        _subscriptions(server_id, +1)
        try:
            yield entered
        finally:
            _subscriptions(server_id, -1)


@_never_raises
def _subscriptions(server_id: int, change: int) -> None:
    SUBSCRIPTIONS_OPEN.labels(str(server_id)).inc(change)


@_never_raises
def job_ran(kind: str, outcome: str, seconds: float) -> None:
    JOB_ATTEMPTS.labels(kind, outcome).inc()
    JOB_DURATION.labels(kind).observe(seconds)


@_never_raises
def answer_delivered(answered_at: datetime | None) -> None:
    """The server acknowledged an answer stored at `answered_at`."""
    if answered_at is not None:
        ANSWER_DELIVERY.observe(max((datetime.now(UTC) - answered_at).total_seconds(), 0.0))


@_never_raises
def live_push(*, sent: bool) -> None:
    LIVE_PUSHES.labels("sent" if sent else "dropped").inc()


# --- process set-up (apps.py) -----------------------------------------------------------------------------------


def database_statement(alias: str = "default") -> None:
    """A statement sent on a connection's raw cursor, past Django's execute wrappers (taskhub.gateway.direct)."""
    DB_QUERIES.labels(alias).inc()


def _count_query(execute, sql, params, many, context):
    DB_QUERIES.labels(context["connection"].alias).inc()
    return execute(sql, params, many, context)


def _on_connection_created(sender, connection, **kwargs) -> None:
    if _count_query not in connection.execute_wrappers:
        connection.execute_wrappers.append(_count_query)


def count_database_queries() -> None:
    """Count every statement of every database connection this process opens."""
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection_created, dispatch_uid="taskhub.observability.count_queries")


def clean_up_at_exit() -> None:
    """In multiprocess mode, a process that ends takes its live gauges (open subscriptions, process_up) along."""
    if MULTIPROCESS_DIR is None:
        return
    pid = os.getpid()

    def mark_dead() -> None:
        from prometheus_client import multiprocess

        if os.getpid() == pid:  # not a forked child
            with contextlib.suppress(Exception):
                multiprocess.mark_process_dead(pid)

    atexit.register(mark_dead)
