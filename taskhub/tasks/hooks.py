"""Where services hand work to background jobs, inside their transaction.

Each hook defers a procrastinate job through Django's own database connection, so the job row is
committed with the state and its audit row, or not at all. That holds in the worker process too,
where procrastinate's app runs on a connector of its own: the defers here never use it.

Answers and cancels run before launches: a worker takes the waiting job of highest priority first (then the
oldest), so an approver's answer no longer waits behind every launch deferred before it (under load, 1,000
launches held answers ~75 s in the queue). Launches are not starved: a delivery or cancel is one job per human
action (its lock keeps it single), and its retries queue at launch priority (`jobs.DELIVERY_RETRY`), so launches
wait only for first attempts. Priority picks the next job; it never interrupts one that is running.

Jobs are deferred by their task names (below; taskhub/worker/jobs.py registers its tasks under them): the domain
never imports the worker (DESIGN.md, "Dependency direction"). Each job goes to its server's queue
(`servers.hooks.job_queue`): the default one, or for a stdio server the queue only its process's owner runs.
"""

import uuid

from django.db import connection
from procrastinate import tasks

from taskhub import procrastinate_sql
from taskhub.observability import tracing
from taskhub.servers.hooks import DEFAULT_QUEUE, job_queue, jobs_in_django_transaction

# The names the worker's jobs are registered under.
LAUNCH_JOB = "taskhub.launch_task"
ANSWER_DELIVERY_JOB = "taskhub.deliver_answer"
CANCEL_DELIVERY_JOB = "taskhub.deliver_cancel"
ANSWER_DEADLINE_JOB = "taskhub.answer_deadline"
SESSION_TASK_FOLLOW_JOB = "taskhub.follow_session_task"

# procrastinate's default priority is 0; higher runs first.
LAUNCH_PRIORITY = 0
DELIVERY_PRIORITY = 10
# A bulk cancel's jobs (bulk.py) queue with launches, not ahead of them: a bulk of hundreds must not hold up the
# launches and answers of other servers. Their lanes (below) bound how many run at once per server.
BULK_CANCEL_PRIORITY = LAUNCH_PRIORITY


def _defer(
    job_name: str, *, lock: str, priority: int, queue: str, schedule_in: dict[str, float] | None = None, **task_kwargs
) -> int:
    deferrer = tasks.configure_task(
        name=job_name,
        job_manager=jobs_in_django_transaction(),
        lock=lock,
        priority=priority,
        queue=queue,
        schedule_in=schedule_in,
    )
    return deferrer.defer(**task_kwargs)


def enqueue_launch(
    task_id: uuid.UUID,
    *,
    carries_answers: bool = False,
    queue: str = DEFAULT_QUEUE,
    declares_tasks: bool = True,
    not_before_seconds: float | None = None,
) -> None:
    """The launch job sends tools/call for a task in status `launching` and records its outcome.

    An MRTR retry `carries_answers`: its tools/call is the delivery of a round's answers, so it goes as one.
    `declares_tasks=False`: the call does not declare the Tasks extension (a gateway caller that did not).
    `not_before_seconds`: the job runs no sooner (the fallback of a call the gateway sends itself)."""
    priority = DELIVERY_PRIORITY if carries_answers else LAUNCH_PRIORITY
    _defer(
        LAUNCH_JOB,
        lock=f"launch:{task_id}",
        priority=priority,
        queue=queue,
        schedule_in=None if not_before_seconds is None else {"seconds": not_before_seconds},
        task_id=str(task_id),
        **({} if declares_tasks else {"declares_tasks": False}),
        **tracing.job_args(),
    )


def drop_pending_launch(task_id: uuid.UUID) -> int:
    """A launch cancelled before its tool call was sent: its job's waiting retry is cancelled with the caller's
    transaction (one running now finds the task no longer launching and sends nothing). How many were waiting."""
    with connection.cursor() as cursor:
        return procrastinate_sql.cancel_waiting(cursor, lock=f"launch:{task_id}", task_name=LAUNCH_JOB)


def enqueue_answer_delivery(input_request_id: int, *, server_id: int, queue: str = DEFAULT_QUEUE) -> None:
    """The delivery job sends the answer (tasks/update, or an MRTR retry) and marks it delivered. It carries its
    server's id: the job takes its server's slot first, then claims and reads the answer in one statement."""
    _defer(
        ANSWER_DELIVERY_JOB,
        lock=_answer_lock(input_request_id),
        priority=DELIVERY_PRIORITY,
        queue=queue,
        input_request_id=input_request_id,
        server_id=server_id,
        **tracing.job_args(),
    )


def answers_with_delivery_jobs(input_request_ids: list[int]) -> set[int]:
    """Of these answers, those that have a delivery job, whatever its state (waiting, running, done or failed)."""
    with connection.cursor() as cursor:
        locks = procrastinate_sql.locks_with_jobs(
            cursor, locks=[_answer_lock(request_id) for request_id in input_request_ids], task_name=ANSWER_DELIVERY_JOB
        )
    return {request_id for request_id in input_request_ids if _answer_lock(request_id) in locks}


def _answer_lock(input_request_id: int) -> str:
    return f"answer:{input_request_id}"


# NOTIFY channel of the answers to held questions (services/held_questions.py): the payload is the request's id.
HELD_ANSWERS_CHANNEL = "taskhub_held_answers"


def hand_over_answer(input_request, *, server) -> None:
    """An answer on its way: a held question's (asked on the session of a call in flight) wakes the worker holding
    the call, which sends it on that session; any other goes to the delivery job."""
    if input_request.held_by:
        wake_held_question(input_request.pk)
    else:
        enqueue_answer_delivery(input_request.pk, server_id=server.pk, queue=job_queue(server))


def wake_held_question(input_request_id: int) -> None:
    """NOTIFY is transactional: the holding worker hears of the answer when it is committed, not before."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [HELD_ANSWERS_CHANNEL, str(input_request_id)])


def enqueue_cancel_delivery(task_id: uuid.UUID, *, queue: str = DEFAULT_QUEUE, lane: str | None = None) -> None:
    """The cancel job sends tasks/cancel once the remote task id is known, and marks it delivered.

    A cancel of a bulk action goes in a `lane` (bulk_cancel_lane): procrastinate runs the jobs of one lock one after
    the other, in order, so a server's bulk cancels run at most (its lanes) at a time, whatever their number, and
    the jobs waiting behind them hold no worker slot. A single cancel has a lock of its own and goes first."""
    _defer(
        CANCEL_DELIVERY_JOB,
        lock=lane or f"cancel:{task_id}",
        priority=BULK_CANCEL_PRIORITY if lane else DELIVERY_PRIORITY,
        queue=queue,
        task_id=str(task_id),
        **tracing.job_args(),
    )


def enqueue_session_task_follow(task_id: uuid.UUID, *, queue: str = DEFAULT_QUEUE) -> None:
    """The follow job takes up a 2025-11-25 task whose follower went (stopped, died, lost its session): it asks the
    server about the task on a session of its own and, if the server still knows it, follows it to its end."""
    _defer(
        SESSION_TASK_FOLLOW_JOB,
        lock=f"follow:{task_id}",
        priority=DELIVERY_PRIORITY,
        queue=queue,
        task_id=str(task_id),
        **tracing.job_args(),
    )


def bulk_cancel_lane(*, server_id: int, index: int, lanes: int) -> str:
    """The lock of the `index`-th cancel to a server in a bulk action: one of the server's `lanes` lanes."""
    return f"bulk-cancel:{server_id}:{index % max(1, lanes)}"


def enqueue_deadline_checks(input_request_id: int, *, at: list) -> None:
    """The deadline job looks at a request at each of the moments `at` (when its deadline is near, and when it
    passes) and does what is due then. Jobs wait in Postgres, so they outlive a worker restart; the periodic sweep
    (worker/sweeps.py) catches any that were lost. They touch no server, so they go to the default queue."""
    for moment in at:
        deferrer = tasks.configure_task(
            name=ANSWER_DEADLINE_JOB,
            job_manager=jobs_in_django_transaction(),
            priority=DELIVERY_PRIORITY,
            queue=DEFAULT_QUEUE,
            schedule_at=moment,
        )
        deferrer.defer(input_request_id=input_request_id)
