"""What every phase of the task services shares: locking, announcing a change after commit, the status line."""

import functools
import logging
import uuid
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now
from django.utils import timezone

from taskhub.accounts import permissions
from taskhub.database.prepared import prepared_cursor
from taskhub.servers.models import ServerProcess
from taskhub.tasks import hooks, raw_rows, signals
from taskhub.tasks.errors import LeaseLost
from taskhub.tasks.models import (
    STATUS_MESSAGE_MAX_CHARS,
    TRUNCATION_NOTE,
    InputRequest,
    Task,
    TaskPoll,
    has_input_requests_sql,
)

# What apply_snapshot compares. lastUpdatedAt is left out on purpose: some peers bump it on every
# read, so it is stored only along with a real change.
SNAPSHOT_FIELDS = ("status", "status_message", "result", "error", "ttl_ms", "poll_interval_ms", "remote_created_at")
TERMINAL_FIELDS = ("status", "result", "error")
# What a protocol error note quotes of a stored or received value, at most (as JSON).
QUOTE_MAX_CHARS = 500
# What a log line quotes of a problem, at most: the timeline has the rest.
LOG_PROBLEM_MAX_CHARS = 300

# The package's name, as before it was split: log configurations and filters that name it keep working.
logger = logging.getLogger("taskhub.tasks.services")


def _log_after_commit(message: str, task: Task, *args: Any) -> None:
    """One WARNING line about `task` (our id, its server, the server's task id) once the change is committed: a
    task that ended badly or a server that broke the protocol, for whoever reads the logs rather than the pages."""
    where = (task.id, task.server_id, task.remote_task_id)
    transaction.on_commit(lambda: logger.warning(f"task %s (server %s, remote task %r) {message}", *where, *args))


def cap_status_message(text: str | None) -> str:
    text = text or ""
    if len(text) <= STATUS_MESSAGE_MAX_CHARS:
        return text
    return text[: STATUS_MESSAGE_MAX_CHARS - len(TRUNCATION_NOTE)] + TRUNCATION_NOTE


def _publish_after_commit(task_id: uuid.UUID, *, server_id: int | None = None, asks: bool = False) -> None:
    """`server_id` and `asks`: the task's server and whether the task has input requests (the inbox's sockets hear of
    it then), from a caller that knows both, so the publish need not look the task up."""
    signals.announce_task_changed(task_id, server_id=server_id, asks=asks)


def _finished(task: Task) -> None:
    """Every service that makes a task terminal calls this: task_finished goes out once the change commits."""
    signals.announce_task_finished(task.id, task.status, launched_by_id=task.launched_by_id)


def _locked(task: Task) -> Task:
    """The task read again, locked (FOR NO KEY UPDATE) until the transaction ends: what
    `Task.objects.select_for_update(no_key=True).get(pk=…)` reads, in a statement written and prepared once. Every
    service that changes a task begins here (an outcome the gateway records while its agent waits among them)."""
    return _read_locked(task, with_asks=False)


def _locked_with_asks(task: Task) -> Task:
    """Locked, with `asks`: whether the task has input requests, whatever their state. What
    `select_for_update(no_key=True).annotate(asks=has_input_requests()).get(pk=…)` reads, in a statement written once:
    every change the worker stores begins here, and through the ORM it took 2.0 ms of the worker's time, now 0.5."""
    return _read_locked(task, with_asks=True)


def _read_locked(task: Task, *, with_asks: bool) -> Task:
    with prepared_cursor() as cursor:
        cursor.execute(_locked_sql(with_asks), [task.pk])
        row = cursor.fetchone()
    if row is None:
        raise Task.DoesNotExist(f"Task {task.pk} does not exist.")
    (locked,) = raw_rows.instances(row[:-1] if with_asks else row, (Task,))
    if with_asks:
        locked.asks = row[-1]
    return locked


@functools.cache
def _locked_sql(with_asks: bool) -> str:
    asks = f", {has_input_requests_sql('t')}" if with_asks else ""
    return (
        f"SELECT {', '.join(raw_rows.columns('t', Task))}{asks} "
        f'FROM "{Task._meta.db_table}" t WHERE t.id = %s FOR NO KEY UPDATE OF t'
    )


def _name(user) -> str:
    return user.get_username() if user is not None else "a deleted user"


def _start_deadline(input_request: InputRequest, *, terms) -> None:
    """Fix the request's answer deadline as its approval rules say, and defer the jobs that act on it."""
    deadline = permissions.answer_deadline(terms=terms, opened_at=input_request.created_at)
    if deadline is None:
        return
    input_request.answer_deadline_at = deadline.at
    input_request.save(update_fields=["answer_deadline_at"])
    hooks.enqueue_deadline_checks(input_request.pk, at=[deadline.near_at, deadline.at])


def _poll_soon(*, task_id: uuid.UUID) -> bool:
    """Ask the tracker to poll this task at once (after an answer or a cancel reached the server, or failed to)."""
    return bool(TaskPoll.objects.filter(task_id=task_id).update(next_poll_at=timezone.now()))


def holds_lease(lease_owner: str, *, server_field: str = "server_id") -> Exists:
    """Over a model with a server: `lease_owner` (a worker) holds the lease of the server's stdio process now, by the
    database's clock. The statements that mark a launch sent or claim an answer's delivery check it, so a worker
    paused past its lease (its memory still says it runs the process) sends nothing: tasks.errors.LeaseLost."""
    return Exists(leases_held_by(lease_owner).filter(server_id=OuterRef(server_field)))


def leases_held_by(lease_owner: str):
    """The stdio processes whose lease `lease_owner` holds now, by the database's clock."""
    return ServerProcess.objects.filter(lease_owner=lease_owner, lease_expires_at__gt=Now())


def lease_lost(lease_owner: str, server_id: int) -> LeaseLost:
    message = f"worker {lease_owner} no longer holds the lease of server {server_id}'s process"
    return LeaseLost(message, server_id=server_id)
