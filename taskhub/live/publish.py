"""What services call after commit to tell browsers something changed.

At-most-once by design: a message lost while the layer is down is not retried, because every page
re-syncs from the database when its socket (re)connects. So publishing never raises into the
service that committed; it logs and drops.
"""

import asyncio
import contextvars
import hashlib
import logging
import os
import threading
import uuid
from collections.abc import Callable

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connections

from taskhub.live.groups import ACCESS_GROUP, CATALOGUE_GROUP, TASKS_GROUP, inbox_group, task_group, user_group
from taskhub.observability import metrics, tracing

logger = logging.getLogger(__name__)

TASK_CHANGED = "task.changed"  # handled by LiveConsumer.task_changed
ACCESS_CHANGED = "access.changed"  # handled by LiveConsumer.access_changed
CATALOGUE_CHANGED = "catalogue.changed"  # only the gateway's listeners join its group (taskhub.gateway.waiting)
SESSION_ENDED = "session.ended"  # handled by LiveConsumer.session_ended
# A layer that cannot be reached (Redis stopped or unreachable) costs the caller this long at most.
SEND_TIMEOUT_SECONDS = 2.0
PUBLISH_THREAD_NAME = "live-publish"  # a publish called from async code runs on a thread of this name

# The loop the in-process consumers run on (daphne's). The in-memory layer's queues belong to it and are
# not thread-safe, so a publish from another thread with its own loop (a worker thread) is handed to it.
_consumer_loop: asyncio.AbstractEventLoop | None = None


def remember_consumer_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _consumer_loop
    _consumer_loop = loop


# Every other publish of the process is sent from one event loop on a thread of its own, which keeps its
# channel-layer connections open between changes. async_to_sync made a thread, a loop and a new Redis
# connection for each change a worker stored (bench/freshness.py: stored → the page's socket frame).
_publisher: tuple[int, asyncio.AbstractEventLoop] | None = None
_publisher_lock = threading.Lock()


def _publisher_loop() -> asyncio.AbstractEventLoop:
    global _publisher
    with _publisher_lock:
        # Per process id: a forked child inherits the variable but not the thread running the loop.
        if _publisher is None or _publisher[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="live-publisher", daemon=True).start()
            _publisher = (os.getpid(), loop)
        return _publisher[1]


def close_layer_connections(layer, *, timeout: float = 10.0) -> None:
    """Close a channel layer's connections on the loop that opened them (this process's publishes): a test that
    gave the publishes a layer of its own. Another loop cannot close them ("attached to a different loop")."""
    asyncio.run_coroutine_threadsafe(layer.close_pools(), _publisher_loop()).result(timeout=timeout)


def publish_task_changed(task_id: uuid.UUID, *, server_id: int | None = None, asks: bool = False) -> None:
    """Tell the pages showing this task (list, detail, inbox, nav counts) to re-render it. Never raises.
    `server_id` and `asks`: the task's server and whether the task has input requests, where the caller knows
    them: no lookup (None: looked up)."""
    _off_the_loop(_publish, task_id, server_id, asks)


def publish_access_changed(*, user_ids: list[int] | None) -> None:
    """Tell these users' sockets (None: every socket) to read their access again. Never raises."""
    _off_the_loop(_publish_access, user_ids)


def publish_catalogue_changed() -> None:
    """Tell the gateway's tool-list listeners that some server's tools as agents see them may have changed. Never
    raises."""
    _off_the_loop(_publish_catalogue)


def publish_session_ended(*, user_id: int, session_key: str) -> None:
    """Close the sockets opened with this session (signed out). Never raises."""
    _off_the_loop(_publish_session_ended, user_id, session_fingerprint(session_key))


def session_fingerprint(session_key: str) -> str:
    """What names a session in a message: not the key itself, which signs its holder in until it is deleted."""
    return hashlib.sha256(session_key.encode()).hexdigest()


# The publishes of a web request held until its response has gone out (hold_publishes): the thread of the request
# that holds them and the list they wait in; None: sent at once. Only that thread's are held (the commits of its
# view): work the request hands to another thread or loop (the gateway's sender, asgiref's threads) inherits this
# context, and its publishes go at once, however long the response takes.
_held: contextvars.ContextVar[tuple[int, list[tuple[Callable, tuple]]] | None] = contextvars.ContextVar(
    "taskhub_held_publishes", default=None
)


def hold_publishes() -> tuple[list[tuple[Callable, tuple]], contextvars.Token]:
    """From now on, on this thread and in this context, publishes are kept in the list returned, for send_held to
    send (a web request's: taskhub.web.middleware.publishes_after_response). The token ends the holding
    (stop_holding)."""
    held: list[tuple[Callable, tuple]] = []
    return held, _held.set((threading.get_ident(), held))


def stop_holding(token: contextvars.Token) -> None:
    _held.reset(token)


def send_held(held: list[tuple[Callable, tuple]]) -> None:
    """Send what was held, in the order it was asked for, from wherever this is called (the request's thread as its
    response closes, or an event loop's when a response never closed is freed). Never raises (each publish logs and
    drops its failures)."""
    while held:
        publish, args = held.pop(0)
        _now_off_the_loop(publish, *args)


def _off_the_loop(publish, *args) -> None:
    holding = _held.get()
    if holding is not None and holding[0] == threading.get_ident():
        holding[1].append((publish, args))
    else:
        _now_off_the_loop(publish, *args)


def _now_off_the_loop(publish, *args) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        publish(*args)
    else:
        # Called from async code: the database lookup and the sync send cannot run on this loop.
        threading.Thread(
            target=tracing.bind(_publish_from_a_thread), args=(publish, *args), name=PUBLISH_THREAD_NAME, daemon=True
        ).start()


def _publish_from_a_thread(publish, *args) -> None:
    try:
        publish(*args)
    finally:
        # The lookup opened this thread's own database connection; left open it would outlive the thread
        # (and keep a test database from being dropped).
        connections.close_all()


@tracing.traced("taskhub.live.publish", kind=tracing.SpanKind.PRODUCER, attributes=tracing.publish_attributes)
def _publish(task_id: uuid.UUID, server_id: int | None = None, asks: bool = False) -> None:
    try:
        if server_id is None:
            groups, server_id = audience_of_task(task_id)
        else:
            groups = _audience(task_id, server_id=server_id, asks=asks)
        message = {"type": TASK_CHANGED, "task_id": str(task_id), "message_id": uuid.uuid4().hex, **tracing.carrier()}
        if server_id is not None:
            # What a socket needs to know whether the change is its business without reading the task first.
            message["server_id"] = server_id
        _send_to_groups(groups, message)
        metrics.live_push(sent=True)
    except Exception:
        metrics.live_push(sent=False)
        logger.warning("live update for task %s dropped: the channel layer did not take it", task_id, exc_info=True)


def _publish_catalogue() -> None:
    try:
        _send_to_groups([CATALOGUE_GROUP], {"type": CATALOGUE_CHANGED, "message_id": uuid.uuid4().hex})
    except Exception:
        logger.warning("a change of the servers' tools not told to the gateway's listeners", exc_info=True)


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
    return audience_of_task(task_id)[0]


def audience_of_task(task_id: uuid.UUID) -> tuple[list[str], int | None]:
    """The groups a change of this task goes to, and its server's id (None: no such task), in one query."""
    from taskhub.tasks.models import Task, has_input_requests

    row = Task.objects.filter(pk=task_id).values_list("server_id", has_input_requests()).first()
    if row is None:
        return _audience(task_id, server_id=None, asks=False), None
    return _audience(task_id, server_id=row[0], asks=row[1]), row[0]


def _audience(task_id: uuid.UUID, *, server_id: int | None, asks: bool) -> list[str]:
    # The task's own group first (_send_to_groups sends them in this order). The inbox's sockets hear only of tasks
    # that have asked something.
    return [task_group(task_id), TASKS_GROUP, *([inbox_group(server_id)] if asks and server_id is not None else [])]


def _send_to_groups(groups: list[str], message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return

    async def send_all() -> None:
        async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
            # One after the other, in the order given: a task's change goes to its own group first (_audience). The
            # pages that show the task and the gateway's waits are in it, and a hub hands them the change with its
            # first copy. Sent at once, the copies' round trips to Redis interleaved and every copy came later, the
            # last one too (bench/publish.py). Each copy names its group: a process's hub (hub.py) hands it to that
            # group's sockets.
            for group in groups:
                await layer.group_send(group, {**message, "group": group})

    loop = _consumer_loop
    if not (isinstance(layer, InMemoryChannelLayer) and loop is not None and loop.is_running()):
        loop = _publisher_loop()
    asyncio.run_coroutine_threadsafe(send_all(), loop).result(timeout=SEND_TIMEOUT_SECONDS + 1)
