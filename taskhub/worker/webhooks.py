"""The job that delivers one outgoing webhook of an approval policy (taskhub.approvals.webhooks decides; this runs).

Each attempt is counted on the delivery row before the POST; a retry is scheduled at the row's `next_try_at`
(NotBefore). A worker stopped mid-POST, or a database error, retries the job too: the row's count of attempts,
not procrastinate's, decides when to give up, so the job may run a few more times than the attempts allowed.
"""

from __future__ import annotations

import datetime
import uuid
from collections import Counter

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from procrastinate.contrib.django import app

from taskhub.approvals import hooks
from taskhub.approvals import webhooks as approval_webhooks
from taskhub.worker.jobs import STOPPED, Backoff, NotBefore, give_back_attempt
from taskhub.worker.orm import db

WEBHOOK_RETRY = Backoff(
    max_attempts=approval_webhooks.job_attempts(), retry_exceptions=(NotBefore, DatabaseError, *STOPPED)
)


# A destination's deliveries at once in this process; one found busy is retried this soon, giving back its attempt.
_sending_to: Counter[str] = Counter()
BUSY_RETRY_SECONDS = 1.0


@app.task(name=hooks.WEBHOOK_DELIVERY_JOB, retry=WEBHOOK_RETRY, pass_context=True)
async def deliver_webhook(context, delivery_id: str) -> str:
    destination = await db(approval_webhooks.destination, delivery_id=uuid.UUID(delivery_id))
    if destination is None:
        return "delivery removed"
    if _sending_to[destination] >= settings.TASKHUB_WEBHOOK_CONCURRENCY_PER_DESTINATION:
        # Its other deliveries are still being sent (a receiver that hangs): this one waits without holding a slot,
        # and without counting an attempt.
        await give_back_attempt(context.job)
        retry_at = timezone.now() + datetime.timedelta(seconds=BUSY_RETRY_SECONDS)
        raise NotBefore(f"webhook delivery {delivery_id}: {destination} is busy", retry_at=retry_at)
    _sending_to[destination] += 1
    try:
        attempt = await db(approval_webhooks.start_attempt, delivery_id=uuid.UUID(delivery_id))
        if attempt is None:
            return "nothing to send"
        outcome = await approval_webhooks.post(attempt)
    finally:
        _sending_to[destination] -= 1
    delivery = await db(approval_webhooks.record_attempt, delivery_id=attempt.delivery_id, outcome=outcome)
    if delivery is None:
        return "delivery removed"
    if delivery.status == "pending" and delivery.next_try_at is not None:
        raise NotBefore(
            f"webhook delivery {delivery_id}: {outcome.http_status or outcome.excerpt}", retry_at=delivery.next_try_at
        )
    return delivery.status
