"""Periodic jobs: expire tasks past their TTL, act on answer deadlines, delete old finished tasks, recover stalled
jobs, requeue mail digests, seal the audit trail's new rows into its chains."""

from __future__ import annotations

import datetime
import logging

from django.conf import settings
from django.db import connection
from django.db.models import F
from django.utils import timezone
from procrastinate.contrib.django import app

from taskhub.approvals import deadlines
from taskhub.approvals import webhooks as approval_webhooks
from taskhub.approvals.notifications import outbox as notification_outbox
from taskhub.audit import chain as audit_chain
from taskhub.audit import retention as audit_retention
from taskhub.tasks import hooks, services
from taskhub.tasks.models import LIVE_STATUSES, Task
from taskhub.tasks.services.delivering import WEB_SEND_MARGIN_SECONDS
from taskhub.worker import heartbeats
from taskhub.worker.orm import db

logger = logging.getLogger(__name__)

# The server may end a task right at its deadline; give the tracker time to see that first.
EXPIRY_GRACE = datetime.timedelta(seconds=60)
PURGE_BATCH = 500


def expire_overdue(*, now: datetime.datetime) -> list[Task]:
    """Expire live tasks past createdAt + ttlMs (their expires_at) that showed no change since that moment (spec §6),
    found by the index task_live_expires, oldest end first (in the model's order, by created_at, the cursor's plan
    read every task: 0.3 s at a million)."""
    overdue = (
        Task.objects.filter(
            status__in=LIVE_STATUSES, expires_at__lte=now - EXPIRY_GRACE, updated_at__lte=F("expires_at")
        )
        .order_by("expires_at")
        .only("id", "ttl_ms", "remote_created_at", "expires_at", "updated_at", "status")
    )
    expired = []
    for task in overdue.iterator():
        if services.expire(task=task):
            expired.append(task)
    return expired


def purge_finished(*, now: datetime.datetime, retention_days: int) -> int:
    """Delete tasks that ended more than `retention_days` ago (0 keeps them forever), in batches."""
    if retention_days <= 0:
        return 0
    cutoff = now - datetime.timedelta(days=retention_days)
    total = 0
    while True:
        purged = services.purge_finished_tasks(finished_before=cutoff, limit=PURGE_BATCH)
        total += purged
        if purged < PURGE_BATCH:
            return total


@app.periodic(cron="* * * * *")
@app.task(name="taskhub.expire_overdue_tasks", queueing_lock="taskhub.expire_overdue_tasks")
async def expire_overdue_tasks(timestamp: int) -> int:
    expired = await db(expire_overdue, now=timezone.now())
    if expired:
        logger.info("expired %d task(s) past their TTL", len(expired))
    return len(expired)


@app.task(name=hooks.ANSWER_DEADLINE_JOB)
async def answer_deadline(input_request_id: int) -> str | None:
    """Deferred for the moment a request's deadline is near, and for the moment it passes."""
    return await db(deadlines.check_deadline, input_request_id=input_request_id)


# The safety net of the deferred jobs above (one lost, or deferred before a restore of the database).
@app.periodic(cron="* * * * *")
@app.task(name="taskhub.sweep_answer_deadlines", queueing_lock="taskhub.sweep_answer_deadlines")
async def sweep_answer_deadlines(timestamp: int) -> int:
    applied = await db(deadlines.sweep)
    if applied:
        logger.info("applied the deadline default of %d input request(s)", applied)
    return applied


# An answer the web process claimed to send itself has no delivery job (services.answer_input's `caller_sends`): should
# the process stop before it records the send, its claim is found here once it is surely over.
@app.periodic(cron="* * * * *")
@app.task(name="taskhub.sweep_answers_the_web_left", queueing_lock="taskhub.sweep_answers_the_web_left")
async def sweep_answers_the_web_left(timestamp: int) -> int:
    waited = heartbeats.web_send_ends_seconds() + WEB_SEND_MARGIN_SECONDS
    claimed_before = timezone.now() - datetime.timedelta(seconds=waited)
    handed = await db(services.hand_over_answers_the_web_left, claimed_before=claimed_before)
    if handed:
        logger.warning(
            "the web process claimed %d answer(s) to send and recorded nothing since: handed to the delivery job (%s)",
            len(handed),
            ", ".join(map(str, handed)),
        )
    return len(handed)


# Audit rows are chained after their commit (audit migration 0011): within a minute here, and by whatever reads the
# chain (verify, exports, archives) before it reads.
@app.periodic(cron="* * * * *")
@app.task(name="taskhub.seal_audit_rows", queueing_lock="taskhub.seal_audit_rows")
async def seal_audit_rows(timestamp: int) -> int:
    return await db(audit_chain.seal_committed)


@app.periodic(cron="17 * * * *")
@app.task(name="taskhub.purge_old_tasks", queueing_lock="taskhub.purge_old_tasks", pass_context=True)
async def purge_old_tasks(context, timestamp: int) -> int:
    days = settings.TASKHUB_RETENTION_DAYS
    await db(audit_retention.ensure_months_ahead)  # the audit trail's partitions for this month and the next two
    purged = await db(purge_finished, now=timezone.now(), retention_days=days)
    if days > 0:
        cutoff = timezone.now() - datetime.timedelta(days=days)
        await db(approval_webhooks.purge_old_deliveries, created_before=cutoff)
        await context.app.job_manager.delete_old_jobs(
            nb_hours=days * 24, include_failed=True, include_cancelled=True, include_aborted=True
        )
    if purged:
        logger.info("retention: deleted %d task(s) finished more than %d day(s) ago", purged, days)
    return purged


def retry_stalled() -> list[tuple[int, str]]:
    with connection.cursor() as cursor:
        return heartbeats.retry_stalled_jobs_sql(cursor)


# Every worker already does this on each heartbeat (heartbeats.py); this sweep is the safety net.
@app.periodic(cron=settings.TASKHUB_STALLED_SWEEP_CRON)
@app.task(name="taskhub.retry_stalled_jobs", queueing_lock="taskhub.retry_stalled_jobs", pass_context=True)
async def retry_stalled_jobs(context, timestamp: int) -> int:
    """Requeue jobs whose worker died. A recovered launch then finds its marker and reports "outcome unknown"."""
    retried = await db(retry_stalled)
    heartbeats.log_retried(retried)
    return len(retried)


# Each digest job retries a failing mail server for about an hour; events still unsent after that get a new one here.
@app.periodic(cron="*/5 * * * *")
@app.task(name="taskhub.requeue_mail_digests", queueing_lock="taskhub.requeue_mail_digests")
async def requeue_mail_digests(timestamp: int) -> int:
    queued = await db(notification_outbox.schedule_forgotten_digests)
    if queued:
        logger.info("mail: queued the digest of %d person(s) again, whose events were still unsent", queued)
    return queued
