"""The job that delivers one outgoing webhook of an approval policy (taskhub.approvals.webhooks decides; this runs).

Each attempt is counted on the delivery row before the POST; a retry is scheduled at the row's `next_try_at`
(NotBefore). A worker stopped mid-POST, or a database error, retries the job too: the row's count of attempts,
not procrastinate's, decides when to give up, so the job may run a few more times than the attempts allowed.
"""

from __future__ import annotations

import uuid

from django.db import DatabaseError
from procrastinate.contrib.django import app

from taskhub.approvals import hooks
from taskhub.approvals import webhooks as approval_webhooks
from taskhub.worker.jobs import STOPPED, Backoff, NotBefore, db

WEBHOOK_RETRY = Backoff(
    max_attempts=approval_webhooks.job_attempts(), retry_exceptions=(NotBefore, DatabaseError, *STOPPED)
)


@app.task(name=hooks.WEBHOOK_DELIVERY_JOB, retry=WEBHOOK_RETRY)
async def deliver_webhook(delivery_id: str) -> str:
    attempt = await db(approval_webhooks.start_attempt, delivery_id=uuid.UUID(delivery_id))
    if attempt is None:
        return "nothing to send"
    outcome = await approval_webhooks.post(attempt)
    delivery = await db(approval_webhooks.record_attempt, delivery_id=attempt.delivery_id, outcome=outcome)
    if delivery is None:
        return "delivery removed"
    if delivery.status == "pending" and delivery.next_try_at is not None:
        raise NotBefore(
            f"webhook delivery {delivery_id}: {outcome.http_status or outcome.excerpt}", retry_at=delivery.next_try_at
        )
    return delivery.status
