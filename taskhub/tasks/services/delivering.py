"""Answers and cancels on their way to the server: the delivery jobs claim, confirm and record failures."""

import datetime
import functools
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from taskhub.audit.services import WEB, WORKER, record_event
from taskhub.servers.hooks import job_queue
from taskhub.servers.models import Server, ServerProcess
from taskhub.tasks import hooks, raw_rows
from taskhub.tasks.errors import (
    InvalidTransition,
)
from taskhub.tasks.models import (
    TASK_PHASE,
    InputRequest,
    InputRequestState,
    Task,
)
from taskhub.tasks.services.common import (
    _locked,
    _poll_soon,
    _publish_after_commit,
    holds_lease,
    lease_lost,
    leases_held_by,
)


def claim_delivery(
    *, input_request: InputRequest, attempted_by: str = "", only_if: Q | None = None, lease_owner: str | None = None
) -> bool:
    """Commit, before sending, that this answer may reach the server (see InputRequest.delivery_attempted_at).

    A compare-and-set on the attempt time the caller read: of two jobs delivering one answer at once (a job
    recovered as stalled while its worker still runs it), only one may send. False: another attempt won, or
    `only_if` (a condition checked in the same statement: the worker's own heartbeat is fresh) did not hold. On
    success `input_request` carries the new attempt time, so the same caller can claim again (renew) before sending.

    `lease_owner`: the worker that sends through a stdio server's process. The same statement checks that it still
    holds the process's lease; LeaseLost when it no longer does (paused past it, taken over): nothing may be sent.
    """
    attempted_at = timezone.now()
    claims = InputRequest.objects.filter(
        pk=input_request.pk,
        state=InputRequestState.ANSWERED,
        delivery_attempted_at=input_request.delivery_attempted_at,
    )
    if only_if is not None:
        claims = claims.filter(only_if)
    if lease_owner is not None:
        claims = claims.filter(holds_lease(lease_owner, server_field="task__server_id"))
    claimed = claims.update(delivery_attempted_at=attempted_at, delivery_attempted_by=attempted_by) == 1
    if claimed:
        input_request.delivery_attempted_at = attempted_at
        input_request.delivery_attempted_by = attempted_by
    elif lease_owner is not None:
        server_id = Task.objects.filter(pk=input_request.task_id).values_list("server_id", flat=True).first()
        check_lease(server_id=server_id, lease_owner=lease_owner)
    return claimed


def is_first_send(input_request: InputRequest) -> bool:
    """Whether sending this answer would be a first attempt at a task-phase answer (tasks/update) to a task the server
    runs: what first_claim's statement checks in SQL, for an answer read already (its task with it)."""
    return (
        input_request.mrtr_round == TASK_PHASE
        and input_request.task.remote_task_id is not None
        and input_request.delivery_attempted_at is None
    )


def first_claim(
    *,
    input_request_id: int,
    attempted_by: str = "",
    only_if: tuple[str, Sequence[Any]] | None = None,
    lease_owner: str | None = None,
) -> tuple[str, list[Any]]:
    """claim_delivery for the first attempt to send a task-phase answer, as one statement (and its parameters) that
    also reads what the sending needs: the request with its task and server, as claimed (no lookup before the claim:
    the delivery job's hot path, which runs it on the worker's own pool: jobs.py). Its row, read by first_claimed, is
    None when it is not that (delivered already, an MRTR round's answer, a task with no remote id yet, an attempt made
    before), `only_if` (SQL of a condition and its parameters) did not hold, or `lease_owner` no longer holds the
    lease of the stdio server's process: the caller then reads the request and decides, as claim_delivery's callers
    do (claim_delivery raises LeaseLost)."""
    sql = _first_claim_sql() + (_LEASE_HELD_SQL if lease_owner is not None else "")
    sql += (f" AND ({only_if[0]})" if only_if else "") + " RETURNING " + request_task_server_columns()
    params = [timezone.now(), attempted_by, input_request_id, TASK_PHASE]
    params += [lease_owner] if lease_owner is not None else []
    params += [*(only_if[1] if only_if else ())]
    return sql, params


_LEASE_HELD_SQL = (
    f' AND EXISTS (SELECT 1 FROM "{ServerProcess._meta.db_table}" AS process WHERE process.server_id = server.id'
    " AND process.lease_owner = %s AND process.lease_expires_at > now())"
)


def first_claimed(row: Sequence[Any] | None) -> InputRequest | None:
    """The request claimed by first_claim's statement, with its task and server, from the row it returned."""
    return None if row is None else with_task_and_server(row)


def with_task_and_server(row: Sequence[Any]) -> InputRequest:
    """An input request with its task and server, as select_related("task__server") leaves them, from a row of
    request_task_server_columns()."""
    input_request, task, server = raw_rows.instances(row, (InputRequest, Task, Server))
    raw_rows.relate(task, "server", server)
    raw_rows.relate(input_request, "task", task)
    return input_request


@functools.cache
def _first_claim_sql() -> str:
    request, task, server = (model._meta.db_table for model in (InputRequest, Task, Server))
    return (
        f'UPDATE "{request}" AS request SET delivery_attempted_at = %s, delivery_attempted_by = %s '
        f'FROM "{task}" AS task JOIN "{server}" AS server ON server.id = task.server_id '
        f"WHERE request.id = %s AND task.id = request.task_id AND request.state = '{InputRequestState.ANSWERED}' "
        "AND request.delivery_attempted_at IS NULL AND request.mrtr_round = %s AND task.remote_task_id IS NOT NULL"
    )


@functools.cache
def request_task_server_columns() -> str:
    """The columns with_task_and_server reads, of tables named `request`, `task` and `server` in the statement."""
    models = (("request", InputRequest), ("task", Task), ("server", Server))
    return ", ".join(column for alias, model in models for column in raw_rows.columns(alias, model))


@transaction.atomic
def mark_delivered(*, input_request: InputRequest, confirmed_by: str | None = None, sent_by_web: bool = False) -> bool:
    """The server acknowledged the answer (the delivery job). Idempotent: a repeated delivery changes nothing.

    `confirmed_by`: no acknowledgement came, but this shows the answer was received (the key is no longer
    outstanding); it goes on the timeline. The tracker polls the task at once to see what the answer changed.
    `sent_by_web`: the web process sent it (answer_input's `caller_sends`): the audit row says so.
    """
    delivered = _mark_delivered(input_request=input_request, confirmed_by=confirmed_by, sent_by_web=sent_by_web)
    _poll_soon(task_id=input_request.task_id)
    return delivered


@transaction.atomic
def hand_answer_to_worker(*, input_request: InputRequest, sent: bool) -> bool:
    """The web process did not get an answer it had claimed (answer_input's `caller_sends`) through: the delivery job,
    deferred at once, takes it up, with its retries. Not `sent` (nothing went out: the server did not answer the
    question asked before, or the claim grew too old to send on): the claim is withdrawn, and the job sends it as any
    answer. `sent` (it may have gone out): the claim stands, and the job asks the server whether it arrived before
    sending it again once the attempt has settled. False: the answer is not the web's to hand over (delivered
    meanwhile, or claimed since by another attempt)."""
    claimed = InputRequest.objects.filter(
        pk=input_request.pk,
        state=InputRequestState.ANSWERED,
        delivery_attempted_at=input_request.delivery_attempted_at,
        delivery_attempted_by=WEB,
    )
    if not (claimed.update(delivery_attempted_at=None, delivery_attempted_by="") if not sent else claimed.exists()):
        return False
    server = Server.objects.get(pk=input_request.task.server_id)
    hooks.enqueue_answer_delivery(input_request.pk, server_id=server.pk, queue=job_queue(server))
    return True


def _mark_delivered(*, input_request: InputRequest, confirmed_by: str | None = None, sent_by_web: bool = False) -> bool:
    task = Task.objects.select_for_update(no_key=True).get(pk=input_request.task_id)
    input_request = InputRequest.objects.select_for_update(no_key=True).get(pk=input_request.pk)
    if input_request.state == InputRequestState.DELIVERED:
        return False
    if input_request.state != InputRequestState.ANSWERED:
        raise InvalidTransition(
            f"The request {input_request.key!r} is {input_request.state}; only answers are delivered."
        )
    input_request.state = InputRequestState.DELIVERED
    input_request.delivered_at = timezone.now()
    input_request.save(update_fields=["state", "delivered_at"])
    record_event(
        action="input.delivered",
        actor_label=WEB if sent_by_web else WORKER,
        task=task,
        data={
            "key": input_request.key,
            "mrtr_round": input_request.mrtr_round,
            **({"confirmed_by": confirmed_by} if confirmed_by else {}),
        },
    )
    _publish_after_commit(task.id, server_id=task.server_id, asks=True)
    return True


@transaction.atomic
def mark_cancel_delivered(*, task: Task) -> bool:
    """The server acknowledged tasks/cancel (which only asks: the task may still end otherwise); the tracker
    polls the task at once to see whether it did."""
    task = _locked(task)
    if task.cancel_requested_at is None:
        raise InvalidTransition(f"No cancel was requested for task {task.id}.")
    _poll_soon(task_id=task.id)
    if task.cancel_delivered_at is not None:
        return False
    task.cancel_delivered_at = timezone.now()
    task.save(update_fields=["cancel_delivered_at", "updated_at"])
    record_event(action="task.cancel_delivered", actor_label=WORKER, task=task, data={})
    _publish_after_commit(task.id)
    return True


@transaction.atomic
def record_delivery_failure(*, input_request: InputRequest, error: dict[str, Any], sent_by_web: bool = False) -> None:
    """The server refused the answer (e.g. the task is gone), or could not be reached in time; the answer stays
    recorded, not delivered. The tracker polls the task at once to see where it stands. `sent_by_web`: as
    mark_delivered's; the web's claim is ended (its attempt made, held by nobody), so that no sweep hands the answer
    to the delivery job as one the web process left (hand_over_answers_the_web_left)."""
    task = Task.objects.select_for_update(no_key=True).get(pk=input_request.task_id)
    if sent_by_web:
        InputRequest.objects.filter(pk=input_request.pk, delivery_attempted_by=WEB).update(delivery_attempted_by="")
    record_event(
        action="input.delivery_failed",
        actor_label=WEB if sent_by_web else WORKER,
        task=task,
        data={"key": input_request.key, "mrtr_round": input_request.mrtr_round, "error": error},
    )
    _poll_soon(task_id=task.id)
    _publish_after_commit(task.id)


# How long past the web process's last moment to send an answer it claimed (its claim's hold and its send's timeout)
# the sweep waits before it takes the claim for one left behind.
WEB_SEND_MARGIN_SECONDS = 60.0


@transaction.atomic
def hand_over_answers_the_web_left(*, claimed_before: datetime.datetime) -> list[int]:
    """Answers the web process claimed to send itself (answer_input's `caller_sends`) before `claimed_before` and has
    recorded nothing of since, with no delivery job: the process stopped before it recorded the send, or even before
    it sent. Each goes to the delivery job with the claim standing: the job asks the server whether it arrived before
    it sends it again, as after a worker that stopped. The ids handed over. Locked rows (an answer being recorded
    right now) are left to the next sweep."""
    left = list(
        InputRequest.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
        .select_related("task__server")
        .filter(state=InputRequestState.ANSWERED, delivery_attempted_by=WEB, delivery_attempted_at__lt=claimed_before)
        .order_by("pk")[:HANDED_OVER_AT_ONCE]
    )
    queued = hooks.answers_with_delivery_jobs([request.pk for request in left]) if left else set()
    handed = []
    for request in left:
        if request.pk not in queued:
            server = request.task.server
            hooks.enqueue_answer_delivery(request.pk, server_id=server.pk, queue=job_queue(server))
            handed.append(request.pk)
    return handed


HANDED_OVER_AT_ONCE = 500


@transaction.atomic
def record_cancel_failure(*, task: Task, error: dict[str, Any]) -> None:
    """tasks/cancel was refused, could not be sent in time, or had no remote task to go to. The tracker polls the
    task at once to see where it stands."""
    task = _locked(task)
    record_event(action="task.cancel_failed", actor_label=WORKER, task=task, data={"error": error})
    _poll_soon(task_id=task.id)
    _publish_after_commit(task.id)


def check_lease(*, server_id: int, lease_owner: str) -> None:
    """LeaseLost unless `lease_owner` holds the lease of the stdio server's process now (the database's clock): the
    cancel job asks just before it sends tasks/cancel through the process (nothing is recorded before a cancel is
    sent, so the check is its own statement; a cancel sent twice asks the server the same thing twice)."""
    if not leases_held_by(lease_owner).filter(server_id=server_id).exists():
        raise lease_lost(lease_owner, server_id)
