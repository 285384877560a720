"""Following a 2025-11-25 task on the session that created it (taskhub/mcp/session_tasks.py says why there).

The launch job that got the task handle keeps its client (its session) and stays with the task to its end: one
`tasks/result` is open the whole time (it answers when the task ends, and the task's questions arrive while it is
open: each becomes an input request held by this worker, as a classic elicitation does), and its status and message
come from the server's `notifications/tasks/status` or, failing those, from `tasks/get` at the task's `pollInterval`,
stored as any snapshot is (the loop is taskhub.mcp.session_tasks.SessionTaskFollower, the CLI's too). A cancel a
person asks for goes out on this session. The job holds its server slot meanwhile, as a call with a held question does.

When the session breaks (the server's process exits, the connection goes) or this worker stops, the task is handed on;
when this worker dies, its heartbeats stop and another worker hands it on (services.session_tasks). Handed on, it is
taken up by the follow job (`take_up`), on a session of its own: a server whose tasks outlive their session answers
`tasks/get` and the task is followed on to its end; the reference server, which keeps a task on the session that made
it only, does not know it there, and the task ends as lost with the reason. A task whose ttl passes without an end
expires. Never a task left "working" that nobody follows.
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
from taskhub.worker.progress import CallProgress
from taskhub.worker.tracker.polling import poll_delay_ms

logger = logging.getLogger(__name__)


class _Follower(wire_tasks.SessionTaskFollower):
    """Each status seen stored as a snapshot; a person's Cancel (the cancel job leaves it to us) sent on the session."""

    def __init__(
        self,
        client: TasksClient,
        created: TaskSnapshot,
        *,
        task_id: uuid.UUID,
        asker,
        on_log,
        on_progress=None,
        progress_token: str | None = None,
    ) -> None:
        super().__init__(
            client, created, asker=asker, on_log=on_log, on_progress=on_progress, progress_token=progress_token
        )
        self.task_id = task_id

    def next_look_s(self, last: TaskSnapshot) -> float:
        return poll_delay_ms(last.poll_interval_ms) / 1000  # the tracker's rule, with its jitter

    async def seen(self, snapshot: TaskSnapshot, source: str) -> None:
        await db(_apply, task_id=self.task_id, snapshot=snapshot, source=source)

    async def cancel_due(self) -> bool:
        return await db(session_tasks.cancel_wanted, task_id=self.task_id)

    async def cancel_sent(self, answered: TaskSnapshot) -> None:
        await db(_cancel_delivered, task_id=self.task_id)

    async def cancel_refused(self, error: ProtocolError) -> None:  # said on the task, not tried again
        await db(_cancel_refused, task_id=self.task_id, error=error.to_error_object())


async def follow_on_session(
    client: TasksClient,
    *,
    task_id: uuid.UUID,
    created: TaskSnapshot,
    asker: Asker,
    follower: str,
    on_log: LogSink | None = None,
    progress_token: str | None = None,
) -> str:
    """Follow the task to its end on `client`'s session as worker `follower`; when the session breaks or this worker
    stops, hand it on for another to take up (services.session_tasks.hand_on_session_task). `progress_token`: that of
    the call that made the task, with which the server reports the task's progress."""
    progress = CallProgress(task_id)
    following = _Follower(
        client,
        created,
        task_id=task_id,
        asker=asker,
        on_log=on_log,
        on_progress=progress,
        progress_token=progress_token,
    )
    try:
        final = await following.run()
    except RequestTimeout:  # its ttl passed without an end: the server may have dropped it
        await db(_expire, task_id=task_id)
        return "expired"
    except McpClientError as error:
        why = f"{session_tasks.SESSION_ENDED} ({error})"[:900]
        logger.warning("task %s (2025-11-25): %s; handed on", task_id, why)
        await db(session_tasks.hand_on_session_task, task_id=task_id, follower=follower, why=why)
        return "handed on"
    except asyncio.CancelledError:  # this worker stops: another takes the task up
        await _hand_on_as_this_worker_stops(task_id, follower=follower)
        raise
    finally:
        await progress.aclose()  # its last report stored before the end
    await db(_apply, task_id=task_id, snapshot=final, source="tasks/result")
    return final.status


async def take_up(client: TasksClient, task: Task, *, asker: Asker, follower: str, on_log: LogSink | None) -> str:
    """A task handed on (its follower went), claimed by this worker: the server is asked about it on `client`'s
    session; a server that still knows it is followed on to its end, one that does not ends it as lost."""
    try:
        await client.discover()
        status = await client.get_session_task(task.remote_task_id)
    except ProtocolError as error:  # "task not found", or any refusal: this session cannot follow it
        logger.warning("task %s (2025-11-25): the server does not know it on a new session (%s)", task.pk, error)
        await db(session_tasks.lose_task_not_known_elsewhere, task_id=task.pk)
        return "lost"
    except McpClientError as error:
        why = f"taking the task up failed: {error}"[:900]
        await db(session_tasks.hand_on_session_task, task_id=task.pk, follower=follower, why=why)
        return "handed on"
    except asyncio.CancelledError:  # this worker stops before it could follow
        await _hand_on_as_this_worker_stops(task.pk, follower=follower)
        raise
    if not status.is_terminal:  # one that ended meanwhile: its end is what tasks/result answers
        await db(_apply, task_id=task.pk, snapshot=status, source="tasks/get")
    return await follow_on_session(
        client, task_id=task.pk, created=status, asker=asker, follower=follower, on_log=on_log
    )


async def _hand_on_as_this_worker_stops(task_id: uuid.UUID, *, follower: str) -> None:
    """Shielded: the cancellation that stops the worker cannot cut the record short."""
    handed_on = db(
        session_tasks.hand_on_session_task, task_id=task_id, follower=follower, why=session_tasks.FOLLOWER_GONE
    )
    with contextlib.suppress(Exception):
        await asyncio.shield(handed_on)


def _cancel_delivered(*, task_id: uuid.UUID) -> None:
    services.mark_cancel_delivered(task=Task.objects.get(pk=task_id))


def _cancel_refused(*, task_id: uuid.UUID, error: dict) -> None:
    services.record_cancel_failure(task=Task.objects.get(pk=task_id), error=error)


def _expire(*, task_id: uuid.UUID) -> bool:
    return services.expire(task=Task.objects.get(pk=task_id))


def _apply(*, task_id: uuid.UUID, snapshot: TaskSnapshot, source: str) -> bool:
    return services.apply_snapshot(task=Task.objects.get(pk=task_id), snapshot=snapshot, source=source)
