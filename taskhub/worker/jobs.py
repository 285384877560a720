"""Background jobs on procrastinate: launch a tool call, deliver an answer, deliver a cancel, discover a server.

Every job is async (procrastinate runs them concurrently); the launch opens its own TasksClient and
closes it, deliveries and cancels use the worker's connected one for their server (`clients.py`). Each
reaches the database through `sync_to_async` and changes state only through `taskhub.tasks.services`.
The sweeps (expiry, retention, stalled jobs) are in `sweeps.py`.

Crash safety of the launch: a tool call is not idempotent, so each round of tools/call is sent at
most once. Before sending, `services.mark_launch_sent` commits an (immutable) `task.launch_sent`
audit row for the round; a job that finds that row already there — because the worker died after
sending, or the job was recovered as stalled — marks the launch outcome unknown instead of sending.
Only a failure to reach the server at all, found by connecting before the row is written, is
retried: then nothing can have been sent.

Fairness between servers (`slots.py`): a job takes one of its server's share of this worker's slots just before
it talks to the server — for a first delivery, before its claim — and a job whose server's share is taken raises
`ServerBusy` before anything is claimed, marked or sent, so running it again is always safe. A busy retry does not
count as an attempt (`give_back_attempt`), so a job waiting behind a slow server keeps its whole retry budget.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone
from procrastinate import RetryDecision
from procrastinate.contrib.django import app
from procrastinate.jobs import Job
from procrastinate.retry import BaseRetryStrategy

from taskhub.mcp.client import TasksClient
from taskhub.mcp.errors import McpClientError, ProtocolError, RequestTimeout, TransportError
from taskhub.servers import discovery
from taskhub.servers import hooks as server_hooks
from taskhub.tasks import hooks, services
from taskhub.tasks.models import TASK_PHASE, InputRequest, InputRequestState, Task, TaskStatus
from taskhub.worker.clients import JobClient, job_client
from taskhub.worker.slots import DELIVERY_SLOT_WAIT_SECONDS, SLOTS, ServerBusy, Slot, launch_timeout

logger = logging.getLogger(__name__)

# tools/call may legitimately run for a while before it answers (a synchronous tool): slots.launch_timeout, per server.
DELIVERY_TIMEOUT_SECONDS = settings.TASKHUB_DELIVERY_TIMEOUT_SECONDS
# An attempt cut off before its answer came (its worker stopped, its job was recovered as stalled) may still
# be under way: the server may apply a request it holds after the client gave up. The next attempt waits this
# long after it before asking the server whether the answer arrived, and sends it again only if it did not.
DELIVERY_SETTLE_SECONDS = settings.TASKHUB_DELIVERY_SETTLE_SECONDS
CONFIRMED_AFTER_INTERRUPTION = "tasks/get after an interrupted delivery"
# A job whose server's share of the slots is taken runs again after about this long (procrastinate also polls
# for due jobs every 5 s, so the wait may be longer).
BUSY_RETRY_SECONDS = 1.0


class ServerUnreachable(Exception):
    """The server could not be reached before anything was sent; retrying is safe."""


class LaunchPending(Exception):
    """The cancel waits for the launch to tell whether a remote task exists."""


class NotBefore(Exception):
    """Retry the job at `retry_at`, not on the backoff schedule."""

    def __init__(self, message: str, *, retry_at: datetime.datetime) -> None:
        super().__init__(message)
        self.retry_at = retry_at


@dataclass(frozen=True, kw_only=True)
class Backoff(BaseRetryStrategy):
    """Exponential backoff with a cap and jitter, for the listed exceptions only.

    A job runs at most `max_attempts + 1` times; `is_last(job)` tells the job it will not be retried,
    so it can record why it gave up instead of failing silently.
    """

    max_attempts: int
    retry_exceptions: tuple[type[BaseException], ...]
    first_seconds: float = 1.0
    cap_seconds: float = 300.0
    retry_priority: int | None = None  # None keeps the job's own

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        if isinstance(exception, ServerBusy):  # nothing was done; its attempt is given back (give_back_attempt)
            wait = BUSY_RETRY_SECONDS * random.uniform(0.5, 1.5)
            return RetryDecision(retry_at=timezone.now() + datetime.timedelta(seconds=wait))
        if self.is_last(job) or not isinstance(exception, self.retry_exceptions):
            return None
        if isinstance(exception, NotBefore):
            return RetryDecision(retry_at=exception.retry_at, priority=self.retry_priority)
        wait = min(self.cap_seconds, self.first_seconds * 2**job.attempts) * random.uniform(0.8, 1.2)
        return RetryDecision(retry_at=timezone.now() + datetime.timedelta(seconds=wait), priority=self.retry_priority)

    def is_last(self, job: Job) -> bool:
        return job.attempts >= self.max_attempts


# A worker stopping past its grace time cancels its jobs; each job is safe to run again, so they are retried.
STOPPED = (asyncio.CancelledError,)
UNREACHABLE = (TransportError, RequestTimeout, DatabaseError, *STOPPED)
# About four minutes of attempts to reach the server before a launch is given up as never sent.
LAUNCH_RETRY = Backoff(max_attempts=8, retry_exceptions=(ServerUnreachable, DatabaseError, *STOPPED))
# About two hours (capped at 5 minutes apart): answers and cancels ride out a server outage. Their first attempt
# goes ahead of launches (hooks.DELIVERY_PRIORITY); a retry, for a server in trouble, queues with them instead,
# so many answers to a dead server cannot hold every launch back for those two hours.
DELIVERY_RETRY = Backoff(
    max_attempts=28, retry_exceptions=(*UNREACHABLE, NotBefore), retry_priority=hooks.LAUNCH_PRIORITY
)
CANCEL_RETRY = Backoff(
    max_attempts=28, retry_exceptions=(*UNREACHABLE, LaunchPending), retry_priority=hooks.LAUNCH_PRIORITY
)


async def db[R](function: Callable[..., R], /, **kwargs: Any) -> R:
    """Run ORM code from a job. A long-lived worker must drop connections that died (e.g. a Postgres restart)."""

    def call() -> R:
        if not connection.in_atomic_block:
            close_old_connections()
        return function(**kwargs)

    return await sync_to_async(call)()


def _give_back_attempt(job_id: int) -> None:
    # procrastinate adds one to `attempts` when it retries the job; a busy retry was no attempt to reach the server.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET attempts = attempts - 1 WHERE id = %s AND status = 'doing'", [job_id]
        )


async def give_back_attempt(job: Job) -> None:
    """Before a job raises ServerBusy: its retry must not use up the attempts it has to reach its server."""
    if job.id is None:
        return
    try:
        await db(_give_back_attempt, job_id=job.id)
    except DatabaseError:  # then the retry costs an attempt; ServerBusy itself is retried whatever the count
        logger.warning("job %s: could not give back the attempt of a busy retry", job.id, exc_info=True)


def error_object(error: Exception) -> dict[str, Any]:
    if isinstance(error, ProtocolError):
        return error.to_error_object()
    return {"message": str(error), "kind": type(error).__name__}


# --- launch -----------------------------------------------------------------------------------------


@app.task(name=hooks.LAUNCH_JOB, pass_context=True, retry=LAUNCH_RETRY)
async def launch_task(context, task_id: str) -> str:
    last_attempt = LAUNCH_RETRY.is_last(context.job)
    try:
        return await launch(uuid.UUID(task_id), last_attempt=last_attempt)
    except ServerBusy:
        await give_back_attempt(context.job)
        raise
    except (Exception, asyncio.CancelledError) as error:
        if not last_attempt and isinstance(error, LAUNCH_RETRY.retry_exceptions):
            raise  # procrastinate runs it again
        # Nothing will run this job again: end the task, or it would say "launching" forever. Shielded, so
        # that a worker stopping (the CancelledError) cannot cut the record short.
        attempts = context.job.attempts + 1
        try:
            gave_up = db(services.give_up_launch, task_id=uuid.UUID(task_id), attempts=attempts, error=error)
            await asyncio.shield(gave_up)
        except Exception:
            logger.exception("launch of task %s: recording that it was given up failed", task_id)
        raise


def _launching(task_id: uuid.UUID) -> tuple[Task | None, bool]:
    task = Task.objects.select_related("server").filter(pk=task_id).first()
    if task is None or task.status != TaskStatus.LAUNCHING:
        return None, False
    return task, services.launch_was_sent(task=task)


async def launch(task_id: uuid.UUID, *, last_attempt: bool = True) -> str:
    """Send tools/call for a launching task (first call or MRTR retry) and record what came back."""
    task, already_sent = await db(_launching, task_id=task_id)
    if task is None:
        return "not launching"
    if already_sent:
        await db(services.mark_launch_sent, task=task)  # finds its marker and makes the outcome unknown
        return "outcome unknown"
    if not task.server.enabled:  # disabled after the launch was queued, or before an MRTR retry
        error = {"message": f"The tool call was not sent: the server {task.server.name!r} is disabled."}
        await db(services.record_launch_failure, task=task, error=error, sent=False)
        return "server disabled"
    slot = SLOTS.slot(task.server)
    await slot.take()
    try:
        return await _send_launch(task, last_attempt=last_attempt)
    finally:
        slot.release()


async def _send_launch(task: Task, *, last_attempt: bool) -> str:
    async with TasksClient(task.server.to_target(), timeout=launch_timeout(task.server)) as client:
        try:
            # Reach the server before the marker is written: a failure here cannot have sent anything.
            await client.discover()
        except (TransportError, RequestTimeout) as error:
            if not last_attempt:
                raise ServerUnreachable(str(error)) from error
            await db(services.record_launch_failure, task=task, error=_not_sent(error), sent=False)
            return "not sent"
        except Exception as error:  # refused credentials, a broken discovery answer…: retrying will not help
            await db(services.record_launch_failure, task=task, error=_not_sent(error), sent=False)
            return "not sent"

        call = await db(services.mark_launch_sent, task=task)
        if call is None:
            return "outcome known or unknown already"
        try:
            outcome = await client.call_tool(
                call.tool, call.arguments, input_responses=call.input_responses, request_state=call.request_state
            )
        except ProtocolError as error:
            await db(services.record_launch_failure, task=task, error=error.to_error_object(), sent=True)
            return "refused"
        except Exception as error:
            # The request may have reached the server (and run): say so, never resend.
            logger.warning("tools/call of task %s: no usable answer (%s)", task.id, error)
            await db(services.mark_launch_unknown, task=task, reason=f"tools/call sent, but no usable answer: {error}")
            return "outcome unknown"
    logger.info("tools/call of task %s answered: %s", task.id, type(outcome).__name__)
    await db(services.record_launch_outcome, task=task, outcome=outcome, answered_request_ids=call.answered_request_ids)
    return type(outcome).__name__


def _not_sent(error: Exception) -> dict[str, Any]:
    return {**error_object(error), "message": f"The tool call was not sent: {error}"}


# --- deliver an answer ------------------------------------------------------------------------------


@app.task(name=hooks.ANSWER_DELIVERY_JOB, pass_context=True, retry=DELIVERY_RETRY)
async def deliver_answer(context, input_request_id: int) -> str:
    try:
        return await deliver(input_request_id, last_attempt=DELIVERY_RETRY.is_last(context.job))
    except ServerBusy:
        await give_back_attempt(context.job)
        raise


def _answer_to_deliver(input_request_id: int) -> tuple[InputRequest | None, bool, Slot | None]:
    """The answer to deliver, whether it is claimed already, and its server's slot (taken if claimed).

    A first attempt to send a task-phase answer has nothing to ask the server before its claim, so it claims in
    the same trip to the database (one thread hop and connection check less before the answer goes out) — if it
    gets a slot of its server's share: an answer claimed and not sent would wait for the settle time."""
    input_request = InputRequest.objects.select_related("task__server").filter(pk=input_request_id).first()
    if input_request is None or input_request.state != InputRequestState.ANSWERED:
        return None, False, None  # delivered already (the job ran twice), or nothing to deliver
    slot = SLOTS.slot(input_request.task.server)
    first_send = (
        input_request.mrtr_round == TASK_PHASE
        and input_request.task.remote_task_id is not None
        and input_request.delivery_attempted_at is None
    )
    try:
        claimed = first_send and slot.try_take() and services.claim_delivery(input_request=input_request)
        return input_request, claimed, slot
    except BaseException:
        slot.release()
        raise


async def deliver(input_request_id: int, *, last_attempt: bool = True) -> str:
    """Send one answer: tasks/update with that key alone, or (MRTR) resend tools/call once the round is complete."""
    loading = asyncio.ensure_future(db(_answer_to_deliver, input_request_id=input_request_id))
    try:
        input_request, claimed, slot = await asyncio.shield(loading)
    except asyncio.CancelledError:  # the worker stops: the thread still finishes, and may have taken a slot
        loading.add_done_callback(_release_loaded_slot)
        raise
    if input_request is None or slot is None:
        return "nothing to deliver"
    try:
        return await _deliver(input_request, claimed=claimed, slot=slot, last_attempt=last_attempt)
    finally:
        slot.release()


def _release_loaded_slot(loading: asyncio.Future) -> None:
    if not loading.cancelled() and loading.exception() is None and (slot := loading.result()[2]) is not None:
        slot.release()


async def _deliver(input_request: InputRequest, *, claimed: bool, slot: Slot, last_attempt: bool) -> str:
    task = input_request.task
    if input_request.mrtr_round != TASK_PHASE:
        # The launch job sends the whole round; this answer may be the one that completes it.
        scheduled = await db(services.schedule_mrtr_retry, task=task, mrtr_round=input_request.mrtr_round)
        return "round complete, retry scheduled" if scheduled else "waiting for the rest of the round"
    if task.remote_task_id is None:
        raise services.InvalidTransition(f"Task {task.id} has no remote task to deliver {input_request.key!r} to.")
    if input_request.delivery_attempted_at is not None and not last_attempt:
        settled_at = input_request.delivery_attempted_at + datetime.timedelta(seconds=DELIVERY_SETTLE_SECONDS)
        if timezone.now() < settled_at:
            raise NotBefore(f"an earlier attempt to deliver {input_request.pk} may be under way", retry_at=settled_at)

    await slot.take(wait=DELIVERY_SLOT_WAIT_SECONDS)
    async with job_client(task.server.to_target(), timeout=DELIVERY_TIMEOUT_SECONDS) as client:
        try:
            if input_request.delivery_attempted_at is not None and await _already_received(client, input_request):
                await db(
                    services.mark_delivered, input_request=input_request, confirmed_by=CONFIRMED_AFTER_INTERRUPTION
                )
                return "already received"
            if not claimed and not await db(services.claim_delivery, input_request=input_request):
                retry_at = timezone.now() + datetime.timedelta(seconds=DELIVERY_SETTLE_SECONDS)
                raise NotBefore(f"another job is delivering {input_request.pk}", retry_at=retry_at)
            logger.info("tasks/update of task %s: sending the answer to input request %s", task.id, input_request.pk)
            answer = {input_request.key: input_request.answer}
            await client.request(lambda tasks: tasks.update_task(task.remote_task_id, answer))
        except ProtocolError as error:
            # -32602 (task not found or expired, or an answer the server rejects): retrying cannot help.
            await db(services.record_delivery_failure, input_request=input_request, error=error.to_error_object())
            return "refused"
        except (TransportError, RequestTimeout) as error:
            if not last_attempt:
                raise
            await db(services.record_delivery_failure, input_request=input_request, error=_gave_up(error))
            return "gave up"
    await db(services.mark_delivered, input_request=input_request)
    return "delivered"


async def _already_received(client: JobClient, input_request: InputRequest) -> bool:
    """Did an earlier, interrupted attempt reach the server? Then the key is no longer outstanding there.

    Servers must not reuse keys and drop answered ones from `inputRequests` (the conformance suite checks
    that on the next tasks/get), so a key that is gone was received; resending it would deliver it twice.
    """
    snapshot = await client.request(lambda tasks: tasks.get_task(input_request.task.remote_task_id))
    return input_request.key not in (snapshot.input_requests or {})


def _gave_up(error: McpClientError) -> dict[str, Any]:
    return {**error_object(error), "message": f"Gave up after repeated failures: {error}"}


# --- deliver a cancel -------------------------------------------------------------------------------


@app.task(name=hooks.CANCEL_DELIVERY_JOB, pass_context=True, retry=CANCEL_RETRY)
async def deliver_cancel(context, task_id: str) -> str:
    try:
        return await cancel(uuid.UUID(task_id), last_attempt=CANCEL_RETRY.is_last(context.job))
    except ServerBusy:
        await give_back_attempt(context.job)
        raise


async def cancel(task_id: uuid.UUID, *, last_attempt: bool = True) -> str:
    """Send tasks/cancel once the remote task is known; a call still in MRTR rounds is cancelled here."""
    task = await db(Task.objects.select_related("server").filter(pk=task_id).first)
    if task is None or task.cancel_delivered_at is not None or task.is_terminal:
        return "nothing to cancel"
    if task.remote_task_id is None:
        if task.status == TaskStatus.INPUT_REQUIRED:
            await db(services.cancel_before_remote_task, task=task)
            return "cancelled before any server task"
        if task.status == TaskStatus.LAUNCHING and not last_attempt:
            raise LaunchPending(f"task {task.id} is still launching")
        error = {"message": f"No remote task to cancel: the task is {task.get_status_display()}."}
        await db(services.record_cancel_failure, task=task, error=error)
        return "no remote task"

    slot = SLOTS.slot(task.server)
    await slot.take(wait=DELIVERY_SLOT_WAIT_SECONDS)
    try:
        return await _send_cancel(task, last_attempt=last_attempt)
    finally:
        slot.release()


async def _send_cancel(task: Task, *, last_attempt: bool) -> str:
    async with job_client(task.server.to_target(), timeout=DELIVERY_TIMEOUT_SECONDS) as client:
        try:
            await client.request(lambda tasks: tasks.cancel_task(task.remote_task_id))
        except ProtocolError as error:
            await db(services.record_cancel_failure, task=task, error=error.to_error_object())
            return "refused"
        except (TransportError, RequestTimeout) as error:
            if not last_attempt:
                raise
            await db(services.record_cancel_failure, task=task, error=_gave_up(error))
            return "gave up"
    await db(services.mark_cancel_delivered, task=task)
    return "delivered"


# --- discover a server --------------------------------------------------------------------------------


@app.task(name=server_hooks.DISCOVERY_JOB)
async def discover_server(server_id: int, requested_by: int | None = None) -> str:
    """server/discover (or initialize + tools/list) for a server just added or on "Discover now", recorded by
    servers.discovery like the terminal's discovery. The job's lock (hooks.discovery_lock) keeps two discoveries
    of one server from running at once; this job talks to the server, so a per-server job limit applies to it."""
    await db(lambda: None)  # db() drops a connection that died while the worker waited
    return await discovery.adiscover_requested(server_id=server_id, requested_by=requested_by)
