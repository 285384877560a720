"""What services call after commit to tell browsers something changed.

At-most-once by design: a message lost while the layer is down is not retried, because every page
re-syncs from the database when its socket (re)connects. So publishing never raises into the
service that committed; it logs and drops.
"""

import asyncio
import hashlib
import logging
import threading
import uuid

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connections

from taskhub.live.groups import ACCESS_GROUP, TASKS_GROUP, inbox_group, task_group, user_group

logger = logging.getLogger(__name__)

TASK_CHANGED = "task.changed"  # handled by LiveConsumer.task_changed
ACCESS_CHANGED = "access.changed"  # handled by LiveConsumer.access_changed
SESSION_ENDED = "session.ended"  # handled by LiveConsumer.session_ended
# A layer that cannot be reached (Redis stopped or unreachable) costs the caller this long at most.
SEND_TIMEOUT_SECONDS = 2.0

# The loop the in-process consumers run on (daphne's). The in-memory layer's queues belong to it and are
# not thread-safe, so a publish from another thread with its own loop (a worker thread) is handed to it.
_consumer_loop: asyncio.AbstractEventLoop | None = None


def remember_consumer_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _consumer_loop
    _consumer_loop = loop


def publish_task_changed(task_id: uuid.UUID) -> None:
    """Tell the pages showing this task (list, detail, inbox, nav counts) to re-render it. Never raises."""
    _off_the_loop(_publish, task_id)


def publish_access_changed(*, user_ids: list[int] | None) -> None:
    """Tell these users' sockets (None: every socket) to read their access again. Never raises."""
    _off_the_loop(_publish_access, user_ids)


def publish_session_ended(*, user_id: int, session_key: str) -> None:
    """Close the sockets opened with this session (signed out). Never raises."""
    _off_the_loop(_publish_session_ended, user_id, session_fingerprint(session_key))


def session_fingerprint(session_key: str) -> str:
    """What names a session in a message: not the key itself, which signs its holder in until it is deleted."""
    return hashlib.sha256(session_key.encode()).hexdigest()


def _off_the_loop(publish, *args) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        publish(*args)
    else:
        # Called from async code: the database lookup and the sync send cannot run on this loop.
        threading.Thread(target=_publish_from_a_thread, args=(publish, *args), name="live-publish", daemon=True).start()


def _publish_from_a_thread(publish, *args) -> None:
    try:
        publish(*args)
    finally:
        # The lookup opened this thread's own database connection; left open it would outlive the thread
        # (and keep a test database from being dropped).
        connections.close_all()


def _publish(task_id: uuid.UUID) -> None:
    try:
        groups = groups_for_task(task_id)
        message = {"type": TASK_CHANGED, "task_id": str(task_id), "message_id": uuid.uuid4().hex}
        _send_to_groups(groups, message)
    except Exception:
        logger.warning("live update for task %s dropped: the channel layer did not take it", task_id, exc_info=True)


def _publish_access(user_ids: list[int] | None) -> None:
    try:
        groups = [ACCESS_GROUP] if user_ids is None else [user_group(user_id) for user_id in user_ids]
        _send_to_groups(groups, {"type": ACCESS_CHANGED, "message_id": uuid.uuid4().hex})
    except Exception:
        logger.warning("access change for users %s not told to their sockets", user_ids, exc_info=True)


def _publish_session_ended(user_id: int, session: str) -> None:
    try:
        _send_to_groups([user_group(user_id)], {"type": SESSION_ENDED, "session": session})
    except Exception:
        logger.warning("sign-out of user %s not told to their sockets", user_id, exc_info=True)


def groups_for_task(task_id: uuid.UUID) -> list[str]:
    from taskhub.tasks.models import InputRequest, Task

    groups = [TASKS_GROUP, task_group(task_id)]
    server_id = Task.objects.filter(pk=task_id).values_list("server_id", flat=True).first()
    if server_id is not None and InputRequest.objects.filter(task_id=task_id).exists():
        groups.append(inbox_group(server_id))
    return groups


def _send_to_groups(groups: list[str], message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return

    async def send_all() -> None:
        async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
            for group in groups:
                await layer.group_send(group, message)

    loop = _consumer_loop
    if isinstance(layer, InMemoryChannelLayer) and loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(send_all(), loop).result(timeout=SEND_TIMEOUT_SECONDS + 1)
    else:
        async_to_sync(send_all)()
