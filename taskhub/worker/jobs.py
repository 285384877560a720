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
retried: then nothing can have been sent. Each such attempt is recorded on the task (attempt n of 9, its error,
the next try: `services.record_launch_retry`) and counts against the server's health. A cancel before the marker
ends the task there (`services.request_cancel`, under the task's lock): the job then finds it no longer launching
and sends nothing; a cancel after it waits for the outcome (`LaunchPending`), which may be unknown.

A stdio server's jobs run in the worker that runs its one process (`stdio/`): they are deferred to the server's
own queue, and each talks through that process's client (`stdio.owned_client`). One that lands in another worker
raises `NotOwner` before anything is claimed, marked or sent, and is retried on the server's queue at once.

Fairness between servers (`slots.py`): a job takes one of its server's share of this worker's slots just before
it talks to the server — for a first delivery, before its claim — and a job whose server's share is taken raises
`ServerBusy` before anything is claimed, marked or sent, so running it again is always safe. A busy retry does not
count as an attempt (`give_back_attempt`), so a job waiting behind a slow server keeps its whole retry budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import random
import smtplib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone
from procrastinate import PsycopgConnector, RetryDecision
from procrastinate.contrib.django import app
from procrastinate.exceptions import AppNotOpen
from procrastinate.jobs import Job
from procrastinate.retry import BaseRetryStrategy
from psycopg_pool import AsyncConnectionPool

from taskhub import backoff, procrastinate_sql
from taskhub.approvals.notifications import digest
from taskhub.approvals.notifications import outbox as notification_outbox
from taskhub.database import pooled
from taskhub.mcp.client import TaskCreated, TasksClient
from taskhub.mcp.errors import (
    AuthorizationIncomplete,
    McpClientError,
    ProtocolError,
    RequestTimeout,
    TransportError,
)
from taskhub.observability import metrics, tracing
from taskhub.servers import discovery
from taskhub.servers import hooks as server_hooks
from taskhub.servers import services as server_services
from taskhub.servers.models import Server
from taskhub.tasks import hooks, services
from taskhub.tasks.errors import InvalidTransition, LeaseLost
from taskhub.tasks.models import LAUNCH_ATTEMPTS, TASK_PHASE, InputRequest, InputRequestState, Task, TaskStatus
from taskhub.tasks.services import session_tasks
from taskhub.worker import heartbeats, stdio
from taskhub.worker.clients import JobClient, job_client
from taskhub.worker.heartbeats import claim_clock
from taskhub.worker.held_questions import asker_for
from taskhub.worker.orm import db
from taskhub.worker.progress import CallLog, CallProgress
from taskhub.worker.session_tasks import follow_on_session
from taskhub.worker.session_tasks import take_up as take_up_on_session
from taskhub.worker.slots import DELIVERY_SLOT_WAIT_SECONDS, SLOTS, ServerBusy, Slot, launch_timeout
from taskhub.worker.stdio import NotOwner
from taskhub.worker.stdio.supervisor import StdioSupervisor

logger = logging.getLogger(__name__)

# tools/call may legitimately run for a while before it answers (a synchronous tool): slots.launch_timeout, per server.
DELIVERY_TIMEOUT_SECONDS = settings.TASKHUB_DELIVERY_TIMEOUT_SECONDS
# An attempt cut off before its answer came (its worker stopped, its job was recovered as stalled) may still
# be under way: the server may apply a request it holds after the client gave up. The next attempt waits this
# long after it before asking the server whether the answer arrived, and sends it again only if it did not.
DELIVERY_SETTLE_SECONDS = settings.TASKHUB_DELIVERY_SETTLE_SECONDS
# ...unless the worker that made it is known dead (heartbeats.py took it over): a dead worker's connections closed
# when it died, so what it sent has reached the server, at the latest, by the time its silence was noticed (at least
# TASKHUB_STALLED_WORKER_SECONDS minus one beat after the death). Its attempt settles this long after that, time for
# the server to apply a request it was still processing.
DEAD_WORKER_GRACE_SECONDS = settings.TASKHUB_DEAD_WORKER_GRACE_SECONDS
CONFIRMED_AFTER_INTERRUPTION = "tasks/get after an interrupted delivery"
# A job whose server's share of the slots is taken runs again after about this long (procrastinate also polls
# for due jobs every 5 s, so the wait may be longer).
BUSY_RETRY_SECONDS = 1.0


class LaunchPending(Exception):
    """The cancel waits for the launch to tell whether a remote task exists."""


class NotBefore(Exception):
    """Retry the job at `retry_at`, not on the backoff schedule."""

    def __init__(self, message: str, *, retry_at: datetime.datetime) -> None:
        super().__init__(message)
        self.retry_at = retry_at


class AwaitingAuthorization(Exception):
    """The server needs an admin to connect it again (its OAuth token could not be refreshed): nothing was sent. The
    job waits, its attempt given back, and looks again every TASKHUB_AUTHORIZATION_WAIT_SECONDS until it is
    connected; then it goes out, once (issue 33)."""


async def wait_if_awaiting_authorization(server: Server, error: BaseException | None = None) -> None:
    """Raise AwaitingAuthorization when `server` needs re-authorization now (a query for OAuth servers only)."""
    if server.oauth and await db(server_services.needs_reauthorization, server_id=server.pk):
        raise AwaitingAuthorization(f"the server {server.name!r} needs an admin to connect it again") from error


class ServerUnreachable(NotBefore):
    """The server could not be reached before anything was sent; retrying (at `retry_at`, which the task shows as
    its next try) is safe."""


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
        if isinstance(exception, NotOwner):  # nothing was done; to the worker running the server's process
            wait = 0.0 if exception.queue != job.queue else BUSY_RETRY_SECONDS
            return RetryDecision(retry_at=timezone.now() + datetime.timedelta(seconds=wait), queue=exception.queue)
        if isinstance(exception, AwaitingAuthorization):  # nothing was done; its attempt is given back too
            wait = settings.TASKHUB_AUTHORIZATION_WAIT_SECONDS * random.uniform(0.8, 1.2)
            return RetryDecision(retry_at=timezone.now() + datetime.timedelta(seconds=wait))
        if isinstance(exception, ServerBusy):  # nothing was done; its attempt is given back (give_back_attempt)
            wait = BUSY_RETRY_SECONDS * random.uniform(0.5, 1.5)
            return RetryDecision(retry_at=timezone.now() + datetime.timedelta(seconds=wait))
        if self.is_last(job) or not isinstance(exception, self.retry_exceptions):
            return None
        if isinstance(exception, NotBefore):
            return RetryDecision(retry_at=exception.retry_at, priority=self.retry_priority)
        return RetryDecision(retry_at=self.next_try_at(job.attempts), priority=self.retry_priority)

    def next_try_at(self, attempts: int) -> datetime.datetime:
        """When to run a job again after its attempt number `attempts + 1` failed."""
        wait = backoff.exponential(attempts, first=self.first_seconds, cap=self.cap_seconds) * random.uniform(0.8, 1.2)
        return timezone.now() + datetime.timedelta(seconds=wait)

    def is_last(self, job: Job) -> bool:
        return job.attempts >= self.max_attempts


# A worker stopping past its grace time cancels its jobs; each job is safe to run again, so they are retried.
STOPPED = (asyncio.CancelledError,)
UNREACHABLE = (TransportError, RequestTimeout, DatabaseError, *STOPPED)
# About four minutes of attempts to reach the server before a launch is given up as never sent.
# Each attempt that cannot reach the server is recorded on the task (services.record_launch_retry) with its next try.
LAUNCH_RETRY = Backoff(max_attempts=LAUNCH_ATTEMPTS - 1, retry_exceptions=(ServerUnreachable, DatabaseError, *STOPPED))
# About two hours (capped at 5 minutes apart): answers and cancels ride out a server outage. Their first attempt
# goes ahead of launches (hooks.DELIVERY_PRIORITY); a retry, for a server in trouble, queues with them instead,
# so many answers to a dead server cannot hold every launch back for those two hours.
DELIVERY_RETRY = Backoff(
    max_attempts=28, retry_exceptions=(*UNREACHABLE, NotBefore), retry_priority=hooks.LAUNCH_PRIORITY
)
CANCEL_RETRY = Backoff(
    max_attempts=28, retry_exceptions=(*UNREACHABLE, LaunchPending), retry_priority=hooks.LAUNCH_PRIORITY
)


def _give_back_attempt(job_id: int) -> None:
    with connection.cursor() as cursor:
        procrastinate_sql.give_back_attempt(cursor, job_id=job_id)


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
@tracing.job
async def launch_task(context, task_id: str, declares_tasks: bool = True) -> str:
    last_attempt = LAUNCH_RETRY.is_last(context.job)
    try:
        return await launch(
            uuid.UUID(task_id),
            last_attempt=last_attempt,
            attempts_before=context.job.attempts,
            declares_tasks=declares_tasks,
        )
    except (ServerBusy, NotOwner, AwaitingAuthorization):
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


async def launch(
    task_id: uuid.UUID, *, last_attempt: bool = True, attempts_before: int = 0, declares_tasks: bool = True
) -> str:
    """Send tools/call for a launching task (first call or MRTR retry) and record what came back.

    `attempts_before`: how many attempts of this job came before this one (each failed to reach the server).
    `declares_tasks=False`: without the Tasks extension (over HTTP; a stdio server's owned client always has it)."""
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
    await wait_if_awaiting_authorization(task.server)
    owned = stdio.owned_client(task.server)  # a stdio server's process, if this worker runs it; else NotOwner
    slot = SLOTS.slot(task.server)
    await slot.take()
    try:
        return await _send_launch(
            task, last_attempt=last_attempt, attempts_before=attempts_before, owned=owned, declares_tasks=declares_tasks
        )
    finally:
        slot.release()


@contextlib.asynccontextmanager
async def _launch_client(
    task: Task, owned: TasksClient | None, *, declares_tasks: bool = True
) -> AsyncIterator[TasksClient]:
    if owned is not None:  # the stdio server's long-lived process: used, never closed here
        yield owned
        return
    timeout = launch_timeout(task.server)
    async with TasksClient(task.server.to_target(), timeout=timeout, declare_tasks=declares_tasks) as client:
        yield client


async def _send_launch(
    task: Task,
    *,
    last_attempt: bool,
    attempts_before: int,
    owned: TasksClient | None = None,
    declares_tasks: bool = True,
) -> str:
    worker_id = heartbeats.RUNNING_AS.get() or f"pid-{os.getpid()}"
    async with _launch_client(task, owned, declares_tasks=declares_tasks) as client:
        # The stored catalogue tells the client the tool's `x-mcp-header` parameters (mirrored into `Mcp-Param-*`
        # headers, SEP-2243); a live listing, when one is fetched, wins.
        client.learn_tools(task.server.tools)
        try:
            # Reach the server before the marker is written: a failure here cannot have sent anything.
            await client.discover()
            client.check_tool(task.tool)  # invalid `x-mcp-header` annotations: never called (lands below)
        except (TransportError, RequestTimeout) as error:
            why = str(error) or type(error).__name__
            if last_attempt:
                failure = _not_sent(error)
                await db(services.record_launch_failure, task=task, error=failure, sent=False, unreachable=why)
                return "not sent"
            retry_at = LAUNCH_RETRY.next_try_at(attempts_before)
            attempt = attempts_before + 1
            if not await db(services.record_launch_retry, task=task, attempt=attempt, error=why, next_try_at=retry_at):
                return "not launching"  # cancelled (or ended) meanwhile: no retry
            logger.warning(
                "launch of task %s: attempt %d of %d could not reach server %s (%r); next try at %s",
                task.id,
                attempt,
                LAUNCH_ATTEMPTS,
                task.server_id,
                why[:300],
                retry_at.isoformat(),
            )
            raise ServerUnreachable(why, retry_at=retry_at) from error
        except Exception as error:  # refused credentials, a broken discovery answer…: retrying will not help
            await wait_if_awaiting_authorization(task.server, error)  # unless an admin's Connect will
            await db(services.record_launch_failure, task=task, error=_not_sent(error), sent=False)
            return "not sent"
        if task.server.unreachable_since is not None:  # a launch reached it: its outage is over
            await db(server_services.record_server_success, server=task.server)

        try:
            call = await db(services.mark_launch_sent, task=task, lease_owner=stdio.lease_owner(task.server))
        except LeaseLost as lost:  # paused past its lease: the process is another worker's now; nothing was sent
            raise NotOwner(task.server) from lost
        if call is None:
            return "outcome known or unknown already"
        progress, server_log = CallProgress(task.pk), CallLog(task.pk)
        asker = asker_for(task, worker_id=worker_id)
        try:
            return await _call_and_follow(client, task, call, asker=asker, progress=progress, server_log=server_log)
        finally:
            await server_log.aclose()  # its lines stored, and the call's one audit row


async def _call_and_follow(
    client: TasksClient, task: Task, call, *, asker, progress: CallProgress, server_log: CallLog
) -> str:
    """tools/call, its outcome recorded, and a 2025-11-25 task it made followed on this session to its end."""
    worker_id = heartbeats.RUNNING_AS.get() or f"pid-{os.getpid()}"
    try:
        outcome = await client.call_tool(
            call.tool,
            call.arguments,
            input_responses=call.input_responses,
            request_state=call.request_state,
            # Questions the server asks on the call's session (classic elicitation) go to people, held here.
            asker=asker,
            on_progress=progress,
            on_log=server_log,
        )
    except ProtocolError as error:
        await db(services.record_launch_failure, task=task, error=error.to_error_object(), sent=True)
        return "refused"
    except Exception as error:
        # Answered 401 or 403 (or never sent: no token could be had), and the server now waits for an admin's
        # Connect: the call did not run, so it waits with the launches not sent yet and goes out once after it.
        if await _refused_unrun_for_authorization(task, error) and await db(
            services.withdraw_launch_sent, task=task, reason=REFUSED_UNRUN
        ):
            waits = f"the server {task.server.name!r} needs an admin to connect it again"
            raise AwaitingAuthorization(waits) from error
        # The request may have reached the server (and run): say so, never resend.
        logger.warning("tools/call of task %s: no usable answer (%s)", task.id, error)
        await db(services.mark_launch_unknown, task=task, reason=f"tools/call sent, but no usable answer: {error}")
        return "outcome unknown"
    finally:
        await progress.aclose()  # its last report stored before the outcome ends the task
    logger.info("tools/call of task %s answered: %s", task.id, type(outcome).__name__)
    on_session = isinstance(outcome, TaskCreated) and outcome.on_session and not outcome.task.is_terminal
    await db(
        services.record_launch_outcome,
        task=task,
        outcome=outcome,
        answered_request_ids=call.answered_request_ids,
        follower=worker_id if on_session else "",
    )
    if on_session:  # a 2025-11-25 task lives on this session: followed here, to its end
        assert isinstance(outcome, TaskCreated)
        return await follow_on_session(
            client,
            task_id=task.pk,
            created=outcome.task,
            asker=asker,
            follower=worker_id,
            on_log=server_log,
            progress_token=outcome.progress_token,
        )
    return type(outcome).__name__


REFUSED_UNRUN = (
    "Waiting for an admin to connect the server again: it refused the tool call unrun, for want of authorization."
)


async def _refused_unrun_for_authorization(task: Task, error: BaseException) -> bool:
    """Whether a tools/call failed in its authorization (the OAuth flow of taskhub/mcp/oauth.py gave up: the server
    answered 401 or 403 insufficient_scope, or no token could be got before sending: AuthorizationIncomplete) and the
    server is now marked as needing re-authorization. A resource server refuses a request it does not authorize
    before running it."""
    if not isinstance(error, AuthorizationIncomplete) or not task.server.oauth:
        return False
    return await db(server_services.needs_reauthorization, server_id=task.server_id)


def _not_sent(error: Exception) -> dict[str, Any]:
    return {**error_object(error), "message": f"The tool call was not sent: {error}"}


# --- take up a 2025-11-25 task whose follower went ----------------------------------------------------


# NotOwner (a stdio server's process is another worker's) moves it to its owner; nothing else is retried: a take-up
# that fails hands the task on again (services.session_tasks counts how often).
TAKE_UP_RETRY = Backoff(max_attempts=0, retry_exceptions=())


@app.task(name=hooks.SESSION_TASK_FOLLOW_JOB, pass_context=True, retry=TAKE_UP_RETRY)
@tracing.job
async def follow_session_task(context, task_id: str) -> str:
    try:
        return await take_up(uuid.UUID(task_id))
    except (ServerBusy, NotOwner):
        await give_back_attempt(context.job)
        raise


async def take_up(task_id: uuid.UUID) -> str:
    worker_id = heartbeats.RUNNING_AS.get() or f"pid-{os.getpid()}"
    task = await db(Task.objects.select_related("server").filter(pk=task_id).first)
    if task is None:
        return "no such task"
    server = task.server
    # The process's owner and a slot before the claim: a job moved on (NotOwner, ServerBusy) has claimed nothing.
    owned = stdio.owned_client(server)
    slot = SLOTS.slot(server)
    await slot.take()
    try:
        task = await db(session_tasks.take_up_session_task, task_id=task_id, follower=worker_id)
        if task is None:
            return "nothing to follow"
        server_log = CallLog(task.pk)
        try:
            async with _launch_client(task, owned) as client:
                asker = asker_for(task, worker_id=worker_id)
                return await take_up_on_session(client, task, asker=asker, follower=worker_id, on_log=server_log)
        finally:
            await server_log.aclose()
    finally:
        slot.release()


# --- deliver an answer ------------------------------------------------------------------------------


@app.task(name=hooks.ANSWER_DELIVERY_JOB, pass_context=True, retry=DELIVERY_RETRY)
@tracing.job
async def deliver_answer(context, input_request_id: int, server_id: int | None = None) -> str:
    try:
        last_attempt = DELIVERY_RETRY.is_last(context.job)
        try:
            return await deliver(input_request_id, last_attempt=last_attempt, server_id=server_id)
        except LeaseLost as lost:  # paused past its lease: the process is another worker's now; nothing was sent
            raise NotOwner(lost=lost) from lost
    except (ServerBusy, NotOwner, AwaitingAuthorization):
        await give_back_attempt(context.job)
        raise


async def _answer_to_load(
    input_request_id: int, *, owner: str, server_id: int | None
) -> tuple[InputRequest | None, bool, Slot | None]:
    """The answer to deliver, whether it is claimed already (by `owner`, this worker), and its server's slot (taken
    if claimed).

    A first attempt to send a task-phase answer has nothing to ask the server before its claim. With its server's id
    (the job carries it) and that server's share known here, the slot is taken first and the claim is the one
    statement that also reads the answer, its task and server (services.first_claim), sent from the event loop on
    the worker's own pool: no trip to a thread and back before the answer goes out (an answer claimed and not sent
    would wait for the settle time, hence the slot first). Otherwise (no slot free, not a first send, beating late,
    or a job run outside `manage.py worker`, with no pool) the request is read on Django's connection and decided
    there (_answer_to_deliver)."""
    slot = SLOTS.slot_by_id(server_id) if server_id is not None else None
    pool = _worker_pool()
    supervisor = stdio.current()
    if slot is not None and pool is not None and slot.try_take():
        try:
            only_if = await _beating_condition(owner) if owner else None
            lease_owner = stdio.lease_owner_of(server_id)
            sql, params = services.first_claim(
                input_request_id=input_request_id, attempted_by=owner, only_if=only_if, lease_owner=lease_owner
            )
            input_request = services.first_claimed(await pooled.fetch_one(pool, sql, params))
        except BaseException:
            slot.release()
            raise
        if input_request is not None:
            SLOTS.share(input_request.task.server)  # its share as it is now, for the next job
            return input_request, True, slot
        slot.release()
    return await db(_answer_to_deliver, input_request_id=input_request_id, owner=owner, supervisor=supervisor)


def _worker_pool() -> AsyncConnectionPool | None:
    """The pool of the worker's connector (worker_connector), open on this loop; None outside a worker."""
    connector = app.connector
    if not isinstance(connector, PsycopgConnector):
        return None
    try:
        return connector.pool
    except AppNotOpen:
        return None


_beating_conditions: dict[str, tuple[str, tuple]] = {}


async def _beating_condition(owner: str) -> tuple[str, tuple]:
    """heartbeats.beating_sql(owner), compiled once per owner on a thread (the ORM may ask the database its version)."""
    if owner not in _beating_conditions:
        _beating_conditions[owner] = await db(heartbeats.beating_sql, owner=owner)
    return _beating_conditions[owner]


def _answer_to_deliver(
    input_request_id: int, owner: str, supervisor: StdioSupervisor | None = None
) -> tuple[InputRequest | None, bool, Slot | None]:
    """The answer to deliver, read on Django's connection, claimed if it is a first send and its server has a slot
    free (see _answer_to_load)."""
    input_request = InputRequest.objects.select_related("task__server").filter(pk=input_request_id).first()
    if input_request is None or input_request.state != InputRequestState.ANSWERED:
        return None, False, None  # delivered already (the job ran twice), or nothing to deliver
    slot = SLOTS.slot(input_request.task.server)
    first_send = services.is_first_send(input_request)
    try:
        lease_owner = stdio.lease_owner(input_request.task.server, supervisor=supervisor)
        claimed = first_send and slot.try_take() and _claim(input_request, owner=owner, lease_owner=lease_owner)
        return input_request, claimed, slot
    except BaseException:
        slot.release()
        raise


def _claim(input_request: InputRequest, *, owner: str, lease_owner: str | None = None) -> bool:
    """Claim the delivery for this worker: only while its own heartbeat is fresh (see _send_answer) and, for a stdio
    server, while it holds the lease of the server's process (LeaseLost if not)."""
    only_if = heartbeats.beating(owner) if owner else None
    return services.claim_delivery(
        input_request=input_request, attempted_by=owner, only_if=only_if, lease_owner=lease_owner
    )


async def deliver(input_request_id: int, *, last_attempt: bool = True, server_id: int | None = None) -> str:
    """Send one answer: tasks/update with that key alone, or (MRTR) resend tools/call once the round is complete."""
    owner = heartbeats.RUNNING_AS.get()
    claim_started = claim_clock()  # a claim made in this load holds from (after) this moment
    loading = asyncio.ensure_future(_answer_to_load(input_request_id, owner=owner, server_id=server_id))
    try:
        input_request, claimed, slot = await asyncio.shield(loading)
    except asyncio.CancelledError:  # the worker stops: the load still finishes, and may have taken a slot
        loading.add_done_callback(_release_loaded_slot)
        raise
    if input_request is None or slot is None:
        return "nothing to deliver"
    try:
        claimed_at = claim_started if claimed else None
        return await _deliver(input_request, claimed_at=claimed_at, owner=owner, slot=slot, last_attempt=last_attempt)
    finally:
        slot.release()


def _release_loaded_slot(loading: asyncio.Future) -> None:
    if not loading.cancelled() and loading.exception() is None and (slot := loading.result()[2]) is not None:
        slot.release()


async def _deliver(
    input_request: InputRequest, *, claimed_at: float | None, owner: str, slot: Slot, last_attempt: bool
) -> str:
    """`claimed_at`: the claim_clock() when this job's claim was made, if it is claimed already."""
    task = input_request.task
    tracing.annotate_task(task)
    if task.server.removed_at is not None:  # removed after the answer was given: nobody to tell any more
        error = {"message": f"The answer was not sent: the server {task.server.name!r} was removed."}
        await db(services.record_delivery_failure, input_request=input_request, error=error)
        return "server removed"
    await wait_if_awaiting_authorization(task.server)
    if input_request.mrtr_round != TASK_PHASE:
        # The launch job sends the whole round; this answer may be the one that completes it.
        scheduled = await db(services.schedule_mrtr_retry, task=task, mrtr_round=input_request.mrtr_round)
        return "round complete, retry scheduled" if scheduled else "waiting for the rest of the round"
    if task.remote_task_id is None:
        raise InvalidTransition(f"Task {task.id} has no remote task to deliver {input_request.key!r} to.")
    # An earlier attempt was cut off (its worker died or stopped, or the server did not answer in time). The server
    # is asked first: a key it no longer asks for was received, whenever that is asked. A key it still asks for may be
    # in a request it holds, so it is sent again only once that attempt has settled: in a moment if its worker is
    # known dead (waited for here, holding no slot of the server's share), else on a retry.
    interrupted = claimed_at is None and input_request.delivery_attempted_at is not None
    settling_until = None
    if interrupted and not last_attempt:
        settling_until = await db(_attempt_settles_at, input_request=input_request)
        for _ in range(3):  # a worker found silent is taken over, then its grace passes: then it has settled
            if (
                settling_until is None
                or (wait := (settling_until - timezone.now()).total_seconds()) > DEAD_WORKER_GRACE_SECONDS
            ):
                break
            await asyncio.sleep(max(wait, 0.0))
            settling_until = await db(_attempt_settles_at, input_request=input_request)

    owned = stdio.owned_client(task.server)
    await slot.take(wait=DELIVERY_SLOT_WAIT_SECONDS)
    async with job_client(task.server.to_target(), timeout=DELIVERY_TIMEOUT_SECONDS, owned=owned) as client:
        try:
            if interrupted and await _already_received(client, input_request):
                await db(
                    services.mark_delivered, input_request=input_request, confirmed_by=CONFIRMED_AFTER_INTERRUPTION
                )
                return "already received"
            if settling_until is not None:
                message = f"an earlier attempt to deliver {input_request.pk} may be under way"
                raise NotBefore(message, retry_at=settling_until)
            if claimed_at is None:
                claimed_at = claim_clock()
                lease_owner = stdio.lease_owner(task.server)
                if not await db(_claim, input_request=input_request, owner=owner, lease_owner=lease_owner):
                    raise await _not_claimed(input_request, owner=owner)
            await _send_answer(client, input_request, claimed_at=claimed_at, owner=owner)
        except ProtocolError as error:
            # -32602 (task not found or expired, or an answer the server rejects): retrying cannot help, unless the
            # server refused a token that could not be refreshed: an admin's Connect will.
            await wait_if_awaiting_authorization(task.server, error)
            await db(services.record_delivery_failure, input_request=input_request, error=error.to_error_object())
            return "refused"
        except (TransportError, RequestTimeout) as error:
            await wait_if_awaiting_authorization(task.server, error)
            if not last_attempt:
                raise
            await db(services.record_delivery_failure, input_request=input_request, error=_gave_up(error))
            return "gave up"
    await db(services.mark_delivered, input_request=input_request)
    metrics.answer_delivered(input_request.answered_at)
    return "delivered"


def _attempt_settles_at(*, input_request: InputRequest) -> datetime.datetime | None:
    """When the interrupted attempt to deliver `input_request` can no longer reach the server; None: it cannot now.

    A live (or unknown) worker's attempt may still be in a request it holds open: it settles once the delivery
    timeout has surely passed (DELIVERY_SETTLE_SECONDS). A dead worker's settles DEAD_WORKER_GRACE_SECONDS after its
    death was found: the worker taken over cannot claim again before it beats again, which clears `taken_over_at`
    (then it is alive, and the long settle applies to what it claims)."""
    attempted_at = input_request.delivery_attempted_at
    settles_at = attempted_at + datetime.timedelta(seconds=DELIVERY_SETTLE_SECONDS)
    attempted_by = input_request.delivery_attempted_by
    found_dead_at = heartbeats.taken_over_at(attempted_by)
    if found_dead_at is not None:
        grace = datetime.timedelta(seconds=DEAD_WORKER_GRACE_SECONDS)
        settles_at = min(settles_at, max(found_dead_at, attempted_at) + grace)
    elif heartbeats.is_silent(attempted_by):
        # This job was recovered from its dead runner (procrastinate's own beat, or the minute's sweep, may see the
        # death a beat before any heartbeat's take-over marks the worker): look again once that has happened, when
        # the short grace applies, rather than waiting out the long settle.
        settles_at = min(settles_at, timezone.now() + heartbeats.TAKE_OVER_DUE)
    return settles_at if timezone.now() < settles_at else None


async def _not_claimed(input_request: InputRequest, *, owner: str) -> NotBefore:
    """Why a claim failed, as the retry to make: another attempt won it (it settles first), or this worker's own
    heartbeat is late (then it tries again in a beat)."""
    if owner and not await db(heartbeats.is_beating, owner=owner):
        retry_at = timezone.now() + heartbeats.FRESH_BEAT
        return NotBefore(f"worker {owner} is not beating: it may not claim {input_request.pk}", retry_at=retry_at)
    retry_at = timezone.now() + datetime.timedelta(seconds=DELIVERY_SETTLE_SECONDS)
    return NotBefore(f"another job is delivering {input_request.pk}", retry_at=retry_at)


async def _send_answer(client: JobClient, input_request: InputRequest, *, claimed_at: float, owner: str) -> None:
    """tasks/update with this one key, sent only while this job's claim holds.

    Exactly once, with a worker that was only paused (SIGSTOP, a frozen VM, a long GC) rather than dead: while it
    sleeps the others find it silent, take its delivery over and, after the grace, may send the answer themselves.
    A claim is a compare-and-set on `delivery_attempted_at` made only while the claimant's own beat is fresh
    (heartbeats.beating: beat within FRESH_BEAT, not taken over), so the takeover's claim and a woken worker's claim
    cannot both succeed: the later one finds the attempt time changed. What is left is the moment between a claim and
    the request going out. Another worker can claim no sooner than TASKHUB_STALLED_WORKER_SECONDS - FRESH_BEAT +
    the grace after this worker's fresh claim, so the request goes out only within CLAIM_HOLDS_SECONDS (half of that)
    of the claim, by claim_clock(), which runs on through a pause: a job that finds its claim older (it was
    paused, or connecting took long) claims again, and a woken worker's renewal fails once its delivery was taken
    over (or, before that, while its beat is not yet fresh again): it sends nothing. Outside `manage.py worker`
    (owner "") nobody can find this process dead, and the long settle alone protects its attempts.
    """
    task = input_request.task
    if owner and claim_clock() - claimed_at > heartbeats.CLAIM_HOLDS_SECONDS:
        renewed_at = claim_clock()
        if not await db(_claim, input_request=input_request, owner=owner):
            raise await _not_claimed(input_request, owner=owner)
        if claim_clock() - renewed_at > heartbeats.CLAIM_HOLDS_SECONDS:  # paused again meanwhile: its own retry decides
            retry_at = timezone.now() + datetime.timedelta(seconds=DELIVERY_SETTLE_SECONDS)
            raise NotBefore(f"the claim on {input_request.pk} was renewed too slowly to send", retry_at=retry_at)
    logger.info("tasks/update of task %s: sending the answer to input request %s", task.id, input_request.pk)
    answer = {input_request.key: input_request.answer}
    await client.request(lambda tasks: tasks.update_task(task.remote_task_id, answer))


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
@tracing.job
async def deliver_cancel(context, task_id: str) -> str:
    try:
        return await cancel(uuid.UUID(task_id), last_attempt=CANCEL_RETRY.is_last(context.job))
    except (ServerBusy, NotOwner):
        await give_back_attempt(context.job)
        raise


async def cancel(task_id: uuid.UUID, *, last_attempt: bool = True) -> str:
    """Send tasks/cancel once the remote task is known; a call still in MRTR rounds is cancelled here."""
    task = await db(Task.objects.select_related("server").filter(pk=task_id).first)
    if task is None or task.cancel_delivered_at is not None or task.is_terminal:
        return "nothing to cancel"
    if task.server.removed_at is not None:
        error = {"message": f"The cancel was not sent: the server {task.server.name!r} was removed."}
        await db(services.record_cancel_failure, task=task, error=error)
        return "server removed"
    if task.remote_task_id is None:
        if task.status == TaskStatus.INPUT_REQUIRED:
            await db(services.cancel_before_remote_task, task=task)
            return "cancelled before any server task"
        if task.status == TaskStatus.LAUNCHING and not last_attempt:
            raise LaunchPending(f"task {task.id} is still launching")
        error = {"message": f"No remote task to cancel: the task is {task.get_status_display()}."}
        await db(services.record_cancel_failure, task=task, error=error)
        return "no remote task"

    if task.followed_by:  # a 2025-11-25 task: only its session knows it, and the worker following it there sends this
        return "sent by the worker following it"
    owned = stdio.owned_client(task.server)
    slot = SLOTS.slot(task.server)
    await slot.take(wait=DELIVERY_SLOT_WAIT_SECONDS)
    try:
        if (lease_owner := stdio.lease_owner(task.server)) is not None:
            try:
                await db(services.check_lease, server_id=task.server_id, lease_owner=lease_owner)
            except LeaseLost as lost:  # paused past its lease: the process is another worker's now
                raise NotOwner(task.server) from lost
        return await _send_cancel(task, last_attempt=last_attempt, owned=owned)
    finally:
        slot.release()


async def _send_cancel(task: Task, *, last_attempt: bool, owned: TasksClient | None = None) -> str:
    async with job_client(task.server.to_target(), timeout=DELIVERY_TIMEOUT_SECONDS, owned=owned) as client:
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


# A discovery of a stdio server runs where its process does (NotOwner moves it there); nothing else is retried.
DISCOVERY_RETRY = Backoff(max_attempts=0, retry_exceptions=())


@app.task(name=server_hooks.DISCOVERY_JOB, retry=DISCOVERY_RETRY)
async def discover_server(server_id: int, requested_by: int | None = None) -> str:
    """server/discover (or initialize + tools/list) for a server just added or on "Discover now", recorded by
    servers.discovery like the terminal's discovery. The job's lock (hooks.discovery_lock) keeps two discoveries
    of one server from running at once; this job talks to the server, so a per-server job limit applies to it.
    A stdio server is asked through its process in the worker that runs it (NotOwner: retried there, whatever
    the attempts)."""
    server = await db(Server.objects.filter(pk=server_id).first)  # db() drops a connection that died meanwhile
    owned = stdio.owned_client(server) if server is not None else None
    return await discovery.adiscover_requested(server_id=server_id, requested_by=requested_by, client=owned)


# --- mail digests (taskhub/approvals/notifications) ----------------------------------------------------------------

# A mail server that is down or refuses is tried again for about an hour (capped at 10 minutes apart); the events
# stay unsent meanwhile, and past that the periodic sweep (sweeps.py) queues the digest again.
MAIL_RETRY = Backoff(
    max_attempts=14, retry_exceptions=(smtplib.SMTPException, OSError, DatabaseError, *STOPPED), cap_seconds=600
)


@app.task(name=notification_outbox.MAIL_DIGEST_JOB, retry=MAIL_RETRY)
async def send_mail_digest(user_id: int) -> str:
    """One person's digest: everything waiting for them in the outbox, in one mail."""
    return await db(digest.send_digest, user_id=user_id)
