"""Where approvals hand work to background jobs, inside their transaction (as taskhub.tasks.hooks does): by the
job's name, so approvals never imports the worker (taskhub/worker/webhooks.py registers the job under it)."""

import uuid

from procrastinate import tasks

from taskhub.servers.hooks import jobs_in_django_transaction
from taskhub.tasks.hooks import LAUNCH_PRIORITY

WEBHOOK_DELIVERY_JOB = "taskhub.deliver_webhook"
# Their own queue, run by a job runner of its own in each worker (TASKHUB_WEBHOOK_CONCURRENCY): receivers that hang
# hold none of the slots that launches, answers and cancels run in.
WEBHOOK_QUEUE = "webhooks"


def enqueue_webhook_delivery(delivery_id: uuid.UUID) -> None:
    """The job POSTs one delivery and retries it (taskhub.approvals.webhooks), on the webhooks' own queue (at launches'
    priority within it): a notification must not hold up the work it tells about."""
    deferrer = tasks.configure_task(
        name=WEBHOOK_DELIVERY_JOB,
        job_manager=jobs_in_django_transaction(),
        lock=f"webhook:{delivery_id}",
        priority=LAUNCH_PRIORITY,
        queue=WEBHOOK_QUEUE,
    )
    deferrer.defer(delivery_id=str(delivery_id))
