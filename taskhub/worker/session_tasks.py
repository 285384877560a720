"""Following a 2025-11-25 task on the session that created it (taskhub/mcp/session_tasks.py says why there).

The launch job that got the task handle keeps its client (its session) and stays with the task to its end: one
`tasks/result` is open the whole time (it answers when the task ends, and the task's questions arrive while it is
open: each becomes an input request held by this worker, as a classic elicitation does), and `tasks/get` is asked
at the task's `pollInterval` for its status and message, stored as any snapshot is. A cancel a person asks for goes
out on this session. The job holds its server slot meanwhile, as a call with a held question does.

When the session breaks (the server's process exits, the connection goes) the task ends as lost with the reason;
when this worker stops, it ends the task as lost itself, and when it dies, its heartbeats stop and another worker ends
the task as lost (services.session_tasks.lose_tasks_followed_by). A task whose ttl passes without an end expires.
Never a task left "working" that nobody follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from taskhub.mcp import session_tasks as wire_tasks
from taskhub.mcp.client import TasksClient
from taskhub.mcp.errors import McpClientError, ProtocolError, RequestTimeout
from taskhub.mcp.questions import Asker, LogSink
from taskhub.mcp.wire import TaskSnapshot
from taskhub.tasks import services
from taskhub.tasks.models import Task
from taskhub.tasks.services import session_tasks
from taskhub.worker.orm import db
from taskhub.worker.tracker.polling import poll_delay_ms

logger = logging.getLogger(__name__)


async def follow_on_session(
    client: TasksClient, *, task_id: uuid.UUID, created: TaskSnapshot, asker: Asker, on_log: LogSink | None = None
) -> str:
    remote = created.task_id
    wait = created.ttl_ms / 1000 if created.ttl_ms else wire_tasks.DEFAULT_RESULT_WAIT_SECONDS
    result_call = asyncio.ensure_future(
        client.session_task_result(remote, wait_seconds=wait, asker=asker, on_log=on_log)
    )
    last = created
    cancel_tried = False  # once per session: a refused cancel is said on the task, not sent again every poll
    try:
        while not result_call.done():
            await asyncio.wait({result_call}, timeout=poll_delay_ms(last.poll_interval_ms) / 1000)
            if result_call.done():
                break
            if not cancel_tried and await db(session_tasks.cancel_wanted, task_id=task_id):
                cancel_tried = True
                last = await _cancel(client, task_id=task_id, remote=remote) or last
            try:
                status = await client.get_session_task(remote)
            except McpClientError as error:
                if isinstance(error, ProtocolError):  # the session is alive; the server refuses this read
                    logger.warning("tasks/get of task %s (2025-11-25) refused: %s", task_id, error)
                    continue
                raise
            if status.is_terminal:  # its result is tasks/result's to give, which answers now
                last = status
                continue
            last = status
            await db(_apply, task_id=task_id, snapshot=status, source="tasks/get")
        try:
            final = wire_tasks.final_snapshot(await _last_status(client, remote, last), result=await result_call)
        except ProtocolError as error:
            final = wire_tasks.final_snapshot(await _last_status(client, remote, last), error=error.to_error_object())
    except RequestTimeout:  # its ttl passed without an end: the server may have dropped it
        await db(_expire, task_id=task_id)
        return "expired"
    except McpClientError as error:
        reason = f"{session_tasks.SESSION_ENDED} ({error})"
        logger.warning("task %s (2025-11-25): %s", task_id, reason)
        await db(session_tasks.mark_session_task_lost, task_id=task_id, reason=reason[:1000])
        return "lost"
    except asyncio.CancelledError:  # this worker stops: nobody else can join the session, so the task is lost
        lost = db(session_tasks.mark_session_task_lost, task_id=task_id, reason=session_tasks.FOLLOWER_GONE)
        with contextlib.suppress(Exception):
            await asyncio.shield(lost)
        raise
    finally:
        if not result_call.done():
            result_call.cancel()
            with contextlib.suppress(BaseException):
                await result_call
    await db(_apply, task_id=task_id, snapshot=final, source="tasks/result")
    return final.status


async def _last_status(client: TasksClient, remote: str, last: TaskSnapshot) -> TaskSnapshot:
    """The task's status once tasks/result answered (the server settles it first); the last one seen if it cannot
    be read."""
    if last.is_terminal:
        return last
    try:
        return await client.get_session_task(remote)
    except McpClientError:
        return last


async def _cancel(client: TasksClient, *, task_id: uuid.UUID, remote: str) -> TaskSnapshot | None:
    task = await db(Task.objects.get, pk=task_id)
    try:
        answered = await client.cancel_session_task(remote)
    except ProtocolError as error:  # refused (e.g. it ended meanwhile): said on the task, not tried again
        await db(services.record_cancel_failure, task=task, error=error.to_error_object())
        return None
    await db(services.mark_cancel_delivered, task=task)
    return answered


def _expire(*, task_id: uuid.UUID) -> bool:
    return services.expire(task=Task.objects.get(pk=task_id))


def _apply(*, task_id: uuid.UUID, snapshot: TaskSnapshot, source: str) -> bool:
    return services.apply_snapshot(task=Task.objects.get(pk=task_id), snapshot=snapshot, source=source)
