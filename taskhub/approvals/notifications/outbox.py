"""Events into the outbox, and the digest job that will mail them, in one transaction.

The job is deferred by name (taskhub/worker/jobs.py registers it), with a queueing lock per person: however many
events arrive, one digest per person waits in the queue, and its lock runs one at a time. The first event after a
quiet window is mailed soon (FIRST_MAIL_AFTER, so that a burst arriving together shares the mail); later ones wait
for the end of the window that started with the last digest.
"""

import datetime
import uuid
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from procrastinate import exceptions, tasks

from taskhub.approvals.models import MailEvent, NotificationKind
from taskhub.approvals.notifications import recipients
from taskhub.servers.hooks import DEFAULT_QUEUE, jobs_in_django_transaction
from taskhub.tasks.models import InputRequest, Task

# The name taskhub.worker.jobs.send_mail_digest is registered under.
MAIL_DIGEST_JOB = "taskhub.send_mail_digest"
FIRST_MAIL_AFTER = datetime.timedelta(seconds=5)


def window() -> datetime.timedelta:
    return datetime.timedelta(seconds=max(0.0, settings.TASKHUB_MAIL_DIGEST_SECONDS))


def digest_lock(user_id: int) -> str:
    return f"mail-digest:{user_id}"


def last_digest_at(user_id: int) -> datetime.datetime | None:
    return MailEvent.objects.filter(user_id=user_id, sent_at__isnull=False).aggregate(last=Max("sent_at"))["last"]


def next_digest_at(user_id: int, *, now: datetime.datetime | None = None) -> datetime.datetime:
    """Soon after now, but not before the window since this person's last digest has passed."""
    now = now or timezone.now()
    soon = now + min(FIRST_MAIL_AFTER, window())
    last = last_digest_at(user_id)
    return soon if last is None else max(soon, last + window())


def schedule_digest(user_id: int) -> bool:
    """Defer this person's digest job, unless one is waiting already (it will carry the new events too)."""
    lock = digest_lock(user_id)
    deferrer = tasks.configure_task(
        name=MAIL_DIGEST_JOB,
        job_manager=jobs_in_django_transaction(),
        lock=lock,
        queueing_lock=lock,
        queue=DEFAULT_QUEUE,
        schedule_at=next_digest_at(user_id),
    )
    try:
        # A savepoint: the refused insert of a second waiting job must not break the caller's transaction.
        with transaction.atomic():
            deferrer.defer(user_id=user_id)
    except exceptions.AlreadyEnqueued:
        return False
    return True


def _record(events: list[MailEvent]) -> int:
    if not events:
        return 0
    MailEvent.objects.bulk_create(events, ignore_conflicts=True)
    for user_id in sorted({event.user_id for event in events}):
        schedule_digest(user_id)
    return len(events)


def _accepted_by(input_request: InputRequest) -> set[int]:
    acceptances = input_request.acceptances if isinstance(input_request.acceptances, list) else []
    return {entry.get("user") for entry in acceptances if isinstance(entry, dict)}


@transaction.atomic
def record_request_events(*, kind: str, input_request_ids: Iterable[int], detail: dict[str, Any] | None = None) -> int:
    """Tell the people who may answer these requests (recipients.answerers) that `kind` happened to them."""
    kind = NotificationKind(kind)
    requests = InputRequest.objects.filter(pk__in=list(input_request_ids)).select_related("task")
    who: dict[tuple[int, str, int | None, int | None], list[int]] = {}
    events = []
    for input_request in requests:
        task = input_request.task
        key = (task.server_id, task.tool, input_request.escalated_to_id, task.launched_by_id)
        if key not in who:
            who[key] = recipients.answerers(
                server_id=task.server_id,
                tool=task.tool,
                escalated_to_id=input_request.escalated_to_id,
                launched_by_id=task.launched_by_id,
                kind=kind,
            )
        # Whoever accepted already (one of N) needs no reminder of the deadline.
        accepted = _accepted_by(input_request) if kind == NotificationKind.DEADLINE_NEAR else set()
        events += [
            MailEvent(user_id=user_id, kind=kind, task_id=task.pk, input_request=input_request, detail=detail or {})
            for user_id in who[key]
            if user_id not in accepted
        ]
    return _record(events)


def record_task_finished(*, task_id: uuid.UUID, status: str, launched_by_id: int | None) -> int:
    """Tell whoever launched the task that it ended, if they asked to be told. One query when nobody is to be told (a
    task's end sends this, after its commit): the events and their digest are written in a transaction only then."""
    kind = NotificationKind.TASK_FINISHED
    users = recipients.launcher(launched_by_id=launched_by_id, kind=kind)
    if not users:
        return 0
    with transaction.atomic():
        if not Task.objects.filter(pk=task_id).exists():
            return 0  # deleted meanwhile
        return _record(
            [MailEvent(user_id=user_id, kind=kind, task_id=task_id, detail={"status": status}) for user_id in users]
        )


def users_with_unsent_events(*, older_than: datetime.datetime) -> list[int]:
    return list(
        MailEvent.objects.waiting().filter(created_at__lt=older_than).values_list("user_id", flat=True).distinct()
    )


@transaction.atomic
def schedule_forgotten_digests(*, now: datetime.datetime | None = None) -> int:
    """The safety net (a periodic job): events still unsent once their digest should have gone (its job gave up
    after its retries, or was lost) get a digest job again. How many were queued."""
    now = now or timezone.now()
    older_than = now - window() - FIRST_MAIL_AFTER
    return sum(schedule_digest(user_id) for user_id in users_with_unsent_events(older_than=older_than))


@transaction.atomic
def record_server_needs_authorization(*, server_id: int, server_name: str) -> int:
    """Tell every admin that a server waits for one of them to connect it again (its OAuth token could not be
    refreshed), and the work for it with it."""
    kind = NotificationKind.SERVER_NEEDS_AUTHORIZATION
    detail = {"server_id": server_id, "server": server_name}
    return _record([MailEvent(user_id=user_id, kind=kind, detail=detail) for user_id in recipients.admins()])
