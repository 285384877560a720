"""Cancel many tasks at once: those a filter of the task list matches, or the rows a person ticked (issue 15, 5).

First a dry run (`preview`): how many tasks would be asked to stop, a sample of them, and how many are skipped and
why. Then one service call (`request_cancels`), one transaction: the bulk action's audit row (its query and count),
and for each task the cancel service every single cancel goes through (services.request_cancel: the cancel request,
the task's audit row naming the bulk action, its cancel job). Only tasks created before the dry run ran are
touched, so a task launched while the person read the confirmation is never cancelled unseen.

The jobs go out at a bounded rate (hooks.enqueue_cancel_delivery): each server's cancels of a bulk run in at most
`lanes_for(server)` lanes, one job after the other in each, queued with launches rather than ahead of them, so a
bulk of hundreds to one server never holds up the launches and answers of the others.
"""

from __future__ import annotations

import datetime
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.utils.translation import gettext_noop

from taskhub.accounts import permissions
from taskhub.audit.services import record_event
from taskhub.servers.models import Server
from taskhub.tasks import hooks, services
from taskhub.tasks.errors import InvalidTransition
from taskhub.tasks.models import TERMINAL_STATUSES, Task, TaskStatus

SAMPLE_SIZE = 10

# Why a chosen task is left alone: (key, words, the tasks it applies to). The first that applies is the reason.
_FINISHED = Q(status__in=TERMINAL_STATUSES) | Q(status="lost")  # lost: the stdio branch's final status
SKIP_REASONS: tuple[tuple[str, str, Q], ...] = (
    ("finished", gettext_noop("already finished"), _FINISHED),
    (
        "launch_unknown",
        gettext_noop("launch outcome unknown (no remote task to cancel)"),
        Q(status=TaskStatus.LAUNCH_UNKNOWN),
    ),
    ("removed", gettext_noop("their server was removed"), Q(server__removed_at__isnull=False)),
    ("requested", gettext_noop("cancel already requested"), Q(cancel_requested_at__isnull=False)),
)
SKIP_WORDS = {key: words for key, words, _ in SKIP_REASONS}
CANCELLABLE = (
    ~_FINISHED
    & ~Q(status=TaskStatus.LAUNCH_UNKNOWN)
    & Q(server__removed_at__isnull=True, cancel_requested_at__isnull=True)
)


class BulkRefused(InvalidTransition):
    """The person may not cancel these tasks, or nothing is left to cancel; nothing was changed."""


def max_tasks() -> int:
    return settings.TASKHUB_BULK_CANCEL_MAX


def lanes_for(server: Server) -> int:
    """How many of a bulk's cancels go to `server` at once, across all workers."""
    lanes = settings.TASKHUB_BULK_CANCEL_PER_SERVER
    if server.max_concurrent_jobs:
        lanes = min(lanes, server.max_concurrent_jobs)
    return max(1, lanes)


@dataclass(frozen=True, kw_only=True)
class Preview:
    """The dry run: `count` tasks would be asked to stop (at most max_tasks(); `more` beyond that), `sample` of them;
    `skipped`: (words, how many) of the chosen tasks left alone."""

    count: int
    more: int
    sample: list[Task]
    skipped: list[tuple[str, int]] = field(default_factory=list)

    @property
    def skipped_total(self) -> int:
        return sum(n for _, n in self.skipped)


def _skipped(tasks: QuerySet[Task]) -> list[tuple[str, int]]:
    """How many of `tasks` each reason leaves alone (each task counted once, under its first reason)."""
    counts: dict[str, Any] = {}
    earlier = Q()
    for key, _, condition in SKIP_REASONS:
        counts[key] = Count("pk", filter=condition & ~earlier) if earlier else Count("pk", filter=condition)
        earlier = earlier | condition if earlier else condition
    found = tasks.order_by().aggregate(**counts)
    return [(SKIP_WORDS[key], found[key]) for key, _, _ in SKIP_REASONS if found[key]]


def _in_order(tasks: QuerySet[Task]) -> QuerySet[Task]:
    return tasks.order_by("created_at", "pk")


def preview(*, tasks: QuerySet[Task], user, before: datetime.datetime) -> Preview:
    """What `request_cancels` with the same tasks would do now. Reads only."""
    tasks = tasks.filter(created_at__lte=before)
    if not permissions.is_operator(user):
        total = tasks.order_by().count()
        return Preview(count=0, more=0, sample=[], skipped=[("you may not cancel tasks", total)] if total else [])
    cancellable = tasks.filter(CANCELLABLE)
    count = cancellable.order_by().count()
    limit = max_tasks()
    sample = list(_in_order(cancellable).select_related("server", "launched_by")[:SAMPLE_SIZE])
    return Preview(count=min(count, limit), more=max(0, count - limit), sample=sample, skipped=_skipped(tasks))


@dataclass(frozen=True, kw_only=True)
class BulkCancel:
    """What a bulk cancel did: its audit row, how many tasks were asked to stop, and the skipped ones."""

    audit_id: int
    count: int
    more: int
    skipped: list[tuple[str, int]]
    task_ids: list[uuid.UUID]


@transaction.atomic
def request_cancels(
    *, tasks: QuerySet[Task], user, before: datetime.datetime, query: dict[str, Any], expected: int | None = None
) -> BulkCancel:
    """Ask every cancellable task of `tasks` created by `before` to stop (the oldest max_tasks() of them), in one
    transaction: one audit row for the bulk action (the query, the count asked to stop, the skipped), and for each
    task services.request_cancel (its cancel request, its audit row, its job in its server's lane).

    `query`: the filter as the person gave it (kept in the audit row); `expected`: the count the dry run showed.
    BulkRefused (nothing written) if the user may not cancel tasks or no chosen task is left to cancel."""
    tasks = tasks.filter(created_at__lte=before)
    if not permissions.is_operator(user):
        raise BulkRefused("Only operators and admins may cancel tasks.")
    limit = max_tasks()
    # Locked, oldest first: none of them can finish or be cancelled by someone else before this commits.
    chosen = list(
        _in_order(tasks.filter(CANCELLABLE))
        .select_for_update(no_key=True, of=("self",))
        .only("id", "server_id", "status", "cancel_requested_at", "created_at")[: limit + 1]
    )
    more = 0
    if len(chosen) > limit:
        more = tasks.filter(CANCELLABLE).order_by().count() - limit
        chosen = chosen[:limit]
    skipped = _skipped(tasks)
    if not chosen:
        words = "; ".join(f"{n} {reason}" for reason, n in skipped) or "no task matches"
        raise BulkRefused(f"No task was cancelled: none of the chosen tasks can be cancelled now ({words}).")
    servers = {server.pk: server for server in Server.objects.filter(pk__in={task.server_id for task in chosen})}
    per_server = Counter(task.server_id for task in chosen)
    bulk = record_event(
        action="task.bulk_cancel_requested",
        user=user,
        data={
            "query": query,
            "count": len(chosen),
            "expected": expected,
            "more_not_taken": more,
            "skipped": {reason: n for reason, n in skipped},
            "per_server": {servers[pk].name: n for pk, n in per_server.items()},
            "created_before": before.isoformat(),
        },
    )
    sent: Counter[int] = Counter()
    for task in chosen:
        server = servers[task.server_id]
        lane = hooks.bulk_cancel_lane(server_id=server.pk, index=sent[server.pk], lanes=lanes_for(server))
        sent[server.pk] += 1
        services.request_cancel(task=task, user=user, bulk_action=bulk.pk, lane=lane)
    return BulkCancel(
        audit_id=bulk.pk, count=len(chosen), more=more, skipped=skipped, task_ids=[task.pk for task in chosen]
    )
