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
never imports the worker (DESIGN.md, "Dependency direction"). Each task runs on procrastinate's default queue.
"""

import uuid

from procrastinate import tasks

from taskhub.servers.hooks import jobs_in_django_transaction

# The names the worker's jobs are registered under.
LAUNCH_JOB = "taskhub.launch_task"
ANSWER_DELIVERY_JOB = "taskhub.deliver_answer"
CANCEL_DELIVERY_JOB = "taskhub.deliver_cancel"

# procrastinate's default priority is 0; higher runs first.
LAUNCH_PRIORITY = 0
DELIVERY_PRIORITY = 10


def _defer(job_name: str, *, lock: str, priority: int, **task_kwargs) -> int:
    deferrer = tasks.configure_task(
        name=job_name, job_manager=jobs_in_django_transaction(), lock=lock, priority=priority
    )
    return deferrer.defer(**task_kwargs)


def enqueue_launch(task_id: uuid.UUID, *, carries_answers: bool = False) -> None:
    """The launch job sends tools/call for a task in status `launching` and records its outcome.

    An MRTR retry `carries_answers`: its tools/call is the delivery of a round's answers, so it goes as one."""
    priority = DELIVERY_PRIORITY if carries_answers else LAUNCH_PRIORITY
    _defer(LAUNCH_JOB, lock=f"launch:{task_id}", priority=priority, task_id=str(task_id))


def enqueue_answer_delivery(input_request_id: int) -> None:
    """The delivery job sends the answer (tasks/update, or an MRTR retry) and marks it delivered."""
    _defer(
        ANSWER_DELIVERY_JOB,
        lock=f"answer:{input_request_id}",
        priority=DELIVERY_PRIORITY,
        input_request_id=input_request_id,
    )


def enqueue_cancel_delivery(task_id: uuid.UUID) -> None:
    """The cancel job sends tasks/cancel once the remote task id is known, and marks it delivered."""
    _defer(CANCEL_DELIVERY_JOB, lock=f"cancel:{task_id}", priority=DELIVERY_PRIORITY, task_id=str(task_id))
