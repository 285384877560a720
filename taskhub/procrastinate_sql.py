"""Every statement taskhub sends to procrastinate's own tables and functions, in one place.

procrastinate has no API for these: cancelling a launch's waiting retry with the caller's transaction, giving a busy
job its attempt back, retrying the jobs of a stalled runner in one statement however many workers run it, moving
jobs off a stdio server's queue, and counting the queue for /metrics. Each leans on procrastinate's schema (its
tables' columns, its status values, `procrastinate_retry_job_v2`), which can change in any minor version:
pyproject.toml pins procrastinate to WRITTEN_FOR, and tests/test_forks.py fails when another version is installed and
runs every statement here against the real schema. Plain SQL, nothing of taskhub imported: each caller passes its
cursor (Django's, or the worker's own pool: worker/heartbeats.py). One trigger of procrastinate's is changed by
taskhub's migration tasks/0025 (only a job due at insert is announced), tested there too.
"""

from typing import Any

WRITTEN_FOR = (3, 10)

# A launch cancelled before its tool call was sent: its job's waiting retry is cancelled (tasks/hooks.py).
CANCEL_WAITING_SQL = (
    "UPDATE procrastinate_jobs SET status = 'cancelled' WHERE lock = %s AND task_name = %s AND status = 'todo'"
)

# procrastinate adds one to `attempts` when it retries the job; a busy retry was no attempt to reach the server.
GIVE_BACK_ATTEMPT_SQL = "UPDATE procrastinate_jobs SET attempts = attempts - 1 WHERE id = %s AND status = 'doing'"

# procrastinate's own test of a stalled job (`get_stalled_jobs`: running, and its runner's heartbeat is absent or too
# old) and its own retry function, in one statement: a job is retried once however many workers run this at once
# (a job another one is retrying is skipped, one retried already no longer matches). %(stalled)s: an interval.
RETRY_STALLED_JOBS_SQL = """
SELECT stalled.id, stalled.task_name, procrastinate_retry_job_v2(stalled.id, now(), NULL, NULL, NULL)::text
FROM (
    SELECT job.id, job.task_name
    FROM procrastinate_jobs AS job
    LEFT JOIN procrastinate_workers AS runner ON runner.id = job.worker_id
    WHERE job.status = 'doing'
      AND (job.worker_id IS NULL OR runner.last_heartbeat < now() - %(stalled)s)
    ORDER BY job.id
    FOR UPDATE OF job SKIP LOCKED
) AS stalled
"""

# Jobs left in a stdio server's queue once it is no stdio server any more (its transport changed, or it was
# deleted): nobody would run them there; the default queue does (a job on a deleted server finds nothing to do).
REQUEUE_SQL = """
UPDATE procrastinate_jobs SET queue_name = %(to)s
WHERE queue_name = %(from)s AND status = 'todo'
  AND NOT EXISTS (SELECT 1 FROM servers_server WHERE id = %(server_id)s AND transport = 'stdio')
"""

# /metrics: the jobs waiting and running, per kind (observability/collectors.py).
JOBS_SQL = """
SELECT task_name, status::text, count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing') GROUP BY 1, 2
"""
# Per kind, the first few due jobs in the order they became due: unscheduled ones by id (the order they were
# deferred, give or take the length of the deferring transactions, which the few absorb), scheduled ones (a retry,
# a later start) by scheduled_at; their wait counts from the later of scheduled_at and the `deferred` event.
JOB_WAITS_SQL = """
SELECT kind.task_name, extract(epoch FROM now() - min(greatest(due.scheduled_at, deferred.at)))
FROM unnest(%s::text[]) AS kind (task_name)
CROSS JOIN LATERAL (
    (SELECT id, scheduled_at FROM procrastinate_jobs
     WHERE status = 'todo' AND task_name = kind.task_name AND scheduled_at IS NULL ORDER BY id LIMIT 10)
    UNION ALL
    (SELECT id, scheduled_at FROM procrastinate_jobs
     WHERE status = 'todo' AND task_name = kind.task_name AND scheduled_at <= now() ORDER BY scheduled_at LIMIT 10)
) AS due
LEFT JOIN LATERAL (
    SELECT min(event.at) AS at FROM procrastinate_events AS event
    WHERE event.job_id = due.id AND event.type = 'deferred'
) AS deferred ON true
GROUP BY 1
"""

# The locks, of those given, that jobs of a kind hold, whatever their state.
LOCKS_WITH_JOBS_SQL = "SELECT DISTINCT lock FROM procrastinate_jobs WHERE lock = ANY(%s) AND task_name = %s"


def cancel_waiting(cursor: Any, *, lock: str, task_name: str) -> int:
    """Cancel the job of `task_name` waiting under `lock` (not one running); how many were waiting."""
    cursor.execute(CANCEL_WAITING_SQL, [lock, task_name])
    return cursor.rowcount


def locks_with_jobs(cursor: Any, *, locks: list[str], task_name: str) -> set[str]:
    cursor.execute(LOCKS_WITH_JOBS_SQL, [locks, task_name])
    return {lock for (lock,) in cursor.fetchall()}


def give_back_attempt(cursor: Any, *, job_id: int) -> None:
    cursor.execute(GIVE_BACK_ATTEMPT_SQL, [job_id])


def retry_stalled_jobs(cursor: Any, *, stalled: Any) -> list[tuple[int, str]]:
    """Queue again, at once, the running jobs of job runners silent longer than `stalled`; (job id, task name) of
    each."""
    cursor.execute(RETRY_STALLED_JOBS_SQL, {"stalled": stalled})
    return [(job_id, task_name) for job_id, task_name, _ in cursor.fetchall()]


def requeue_if_no_longer_stdio(cursor: Any, *, server_id: int, queue: str, to: str) -> int:
    cursor.execute(REQUEUE_SQL, {"from": queue, "to": to, "server_id": server_id})
    return cursor.rowcount
