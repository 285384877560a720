"""The live socket, /ws/live/: pushes htmx out-of-band fragments to a signed-in user's pages.

Permissions are checked here, not only in views: the groups joined follow the user's access (read on
connect, again when told it changed, and at the latest every ACCESS_MAX_AGE_SECONDS), a {"watch": "<task
uuid>"} is granted only for a task the user may see, and a change is rendered for the socket's own access.

One change reaches every socket of the process that hears it, so its rendering is shared (sharing.py):
it is rendered in parts, one per kind of interest and sharing; a part of Sharing.AUDIENCE is rendered once
per access (the same bytes for every socket whose user may see the same, whatever else each socket asks
for), one of Sharing.USER once per user. The message says the task's server, so a socket knows its parts
without reading the task; the parts it lacks are rendered in one trip to a live thread, which reads the
task there (once per change).

Each socket's parts are rendered in its reader's language (the one chosen in the session, else the browser's, read
when the socket connects): the language is part of every sharing key, so an audience is one per language too.
"""

import asyncio
import contextlib
import functools
import json
import logging
import threading
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from concurrent.futures import Future

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.contrib.auth import get_user_model
from django.utils import timezone, translation

from taskhub.accounts.language import language_of_socket
from taskhub.database.prepared import prepared_cursor
from taskhub.live import publish
from taskhub.live.access import (
    ACCESS_MAX_AGE_SECONDS,
    NO_ACCESS,
    LiveAccess,
    connected_access,
    current_access,
    rendering_for,
    session_expiries,
    session_expiry,
)
from taskhub.live.fragments import (
    FragmentKind,
    Sharing,
    has_task_fragments,
    has_user_fragments,
    render_task_fragments,
    render_user_fragments,
)
from taskhub.live.groups import ACCESS_GROUP, TASKS_GROUP, inbox_group, task_group, user_group
from taskhub.live.hub import hub_for
from taskhub.live.sharing import shared, shared_all
from taskhub.live.threads import on_live_thread
from taskhub.observability import tracing
from taskhub.servers.models import Server
from taskhub.tasks import raw_rows
from taskhub.tasks.models import Task, TaskPoll, has_input_requests_sql

logger = logging.getLogger(__name__)

# Application close codes (4000-4999). The htmx ws extension reconnects only after 1006/1011/1012/1013,
# so a refused socket is not retried in a loop; live.js retries every other code after a back-off.
CLOSE_NOT_SIGNED_IN = 4401
CLOSE_NO_LONGER_ALLOWED = 4403
# "Service restart" in the application range: daphne (autobahn) sends no 1012 (it raised, and the socket ended as an
# error of the application, logged with its traceback); live.js reconnects this one.
CLOSE_HUB_LOST = 4012
MAX_WATCHED_TASKS = 200
# What a socket watching a task hears of its changes, each in a frame of its own, in this order.
WATCHED_KINDS = (FragmentKind.TASK_STATUS, FragmentKind.TASK)
# One change reaches a connection once per group it shares (tasks, task.<id>, inbox.server.<id>).
REMEMBERED_MESSAGES = 256


class LiveConsumer(AsyncWebsocketConsumer):
    async def __call__(self, scope, receive, send):
        # channels' own __call__, but the group messages come from the process's hub (hub.py) through this
        # socket's inbox, not through a channel of the socket's own.
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.hub = hub_for(self.channel_layer)
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.base_send = send
        with contextlib.suppress(StopConsumer):
            await await_many_dispatch([receive, self.inbox.get], self.dispatch)

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_NOT_SIGNED_IN)
            return
        self.user = user
        self.user_id = user.pk
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.session = publish.session_fingerprint(self.session_key or "")
        self.language = await language_of_socket(self.scope)
        self.session_timer: asyncio.TimerHandle | None = None
        self.access = NO_ACCESS
        self.access_read_at = 0.0
        self.groups_joined: set[str] = set()
        self.watched_tasks: dict[str, int] = {}  # task id → its server's id
        self.recent_message_ids: deque[str] = deque(maxlen=REMEMBERED_MESSAGES)
        loop = asyncio.get_running_loop()
        publish.remember_consumer_loop(loop)

        started = loop.time()
        # Joined before the access and the session are read, so a change or sign-out meanwhile is not missed.
        await self._join(user_group(self.user_id))
        await self._join(ACCESS_GROUP)
        await self._adopt(await on_live_thread(connected_access)(user), read_at=started)
        # The session's expiry (AuthMiddlewareStack checked the rest): the socket closes when it passes.
        expires_at = await on_live_thread(session_expiry)(self.session_key, self.user_id)
        if expires_at is None or expires_at <= timezone.now():
            await self.close(code=CLOSE_NOT_SIGNED_IN)
            return
        await self.accept()
        self._close_at_expiry(expires_at)
        _refreshed_in_background(self)
        # On every (re)connect: the current state from the database, since messages missed meanwhile are lost.
        # Sockets of one audience connecting together share a rendering begun after they joined their groups.
        audience_html = await shared(
            ("connect", self.access, self.language),
            lambda: on_live_thread(_render_user_fragments)(self.user, self.access, Sharing.AUDIENCE, self.language),
            started_after=loop.time(),
        )
        user_html = ""
        if has_user_fragments(Sharing.USER):
            user_html = await on_live_thread(_render_user_fragments)(
                self.user, self.access, Sharing.USER, self.language
            )
        await self._send_html(audience_html + user_html)

    async def dispatch(self, message):
        # channels' own dispatch first closes old database connections on its one process-wide sync thread: a
        # trip through that thread (behind whatever runs there) for every message of every socket, 500 per change
        # at fan-out. This consumer's database work runs on the live threads, whose every call checks their own
        # connections (on_live_thread), so it dispatches straight to the handler.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def disconnect(self, code):
        _access_refreshes.get(asyncio.get_running_loop(), _NO_SOCKETS).sockets.discard(self)
        if getattr(self, "session_timer", None) is not None:
            self.session_timer.cancel()
        for group in list(getattr(self, "groups_joined", ())):
            await self.hub.leave(group, self.inbox)

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "")
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if "watch" in message:
            await self._watch(message["watch"])
        elif "unwatch" in message:
            await self._unwatch(message["unwatch"])

    @tracing.traced(
        "taskhub.live.push",
        kind=tracing.SpanKind.CONSUMER,
        attributes=tracing.push_attributes,
        parent=tracing.event_context,
    )
    async def task_changed(self, event):
        if event.get("message_id") in self.recent_message_ids:
            return
        self.recent_message_ids.append(event.get("message_id"))
        now = asyncio.get_running_loop().time()
        # A read begun in the last second (by a socket of the same user hearing this change) is fresh enough.
        if now - self.access_read_at > ACCESS_MAX_AGE_SECONDS and not await self._read_access(since=now - 1):
            return
        async for html in self._change_frames(event):
            await self._send_html(html)

    async def access_changed(self, event):
        before = self.access
        if await self._read_access(since=asyncio.get_running_loop().time()) and self.access != before:
            # What the nav counts count changed with it (rare: not worth sharing).
            await self._send_html(
                await on_live_thread(_render_user_fragments)(self.user, self.access, None, self.language)
            )

    async def hub_lost(self, event):
        """The process's hub could no longer read the channel layer: the page reconnects (and re-reads)."""
        await self.close(code=CLOSE_HUB_LOST)

    async def session_ended(self, event):
        """The user signed out of a session; this socket closes if it was opened with it."""
        if event.get("session") == self.session:
            await self.close(code=CLOSE_NOT_SIGNED_IN)

    # --- the session ----------------------------------------------------------------------------------------

    def _close_at_expiry(self, expires_at) -> None:
        """Check the session again when it expires (it may have been extended meanwhile)."""
        delay = max(0.0, (expires_at - timezone.now()).total_seconds()) + 0.5
        loop = asyncio.get_running_loop()
        self.session_timer = loop.call_later(delay, self._session_check_due)

    def _session_check_due(self) -> None:
        self.session_timer = None
        # Kept: the loop holds only a weak reference to a task.
        self.session_check = asyncio.get_running_loop().create_task(
            self._check_session(since=asyncio.get_running_loop().time())
        )

    async def _check_session(self, *, since: float) -> bool:
        """False (and the socket closed) once the session no longer signs the user in: signed out elsewhere,
        expired, deleted, or its password changed. Shared by the sockets of one session."""
        expires_at = await shared(
            ("session", self.session),
            lambda: _session_expiry_in_batch(self.session_key, self.user_id),
            started_after=since,
            keep=ACCESS_MAX_AGE_SECONDS,
        )
        if expires_at is None or expires_at <= timezone.now():
            await self.close(code=CLOSE_NOT_SIGNED_IN)
            return False
        if self.session_timer is not None:
            self.session_timer.cancel()
        self._close_at_expiry(expires_at)
        return True

    # --- access -------------------------------------------------------------------------------------------

    async def _read_access(self, *, since: float) -> bool:
        """Read the user's access again (shared with the user's other sockets that need a read begun after
        `since`) and follow it, and check the session still holds; False when the socket was closed because
        the user may no longer use it."""
        user, access = await shared(
            ("access", self.user_id),
            lambda: on_live_thread(current_access)(self.user_id),
            started_after=since,
            keep=ACCESS_MAX_AGE_SECONDS,
        )
        if user is None:
            await self.close(code=CLOSE_NO_LONGER_ALLOWED)
            return False
        if not await self._check_session(since=since):
            return False
        self.user = user
        await self._adopt(access, read_at=asyncio.get_running_loop().time())
        return True

    async def _adopt(self, access: LiveAccess, *, read_at: float) -> None:
        """Follow this access: what is rendered for the socket, and the groups it is in (joined and left)."""
        self.access, self.access_read_at = access, read_at
        for task_id, server_id in list(self.watched_tasks.items()):
            if not (access.sees_all_tasks or server_id in access.approvable_server_ids):
                del self.watched_tasks[task_id]
        wanted = {user_group(self.user_id), ACCESS_GROUP, *map(task_group, self.watched_tasks)}
        wanted |= {TASKS_GROUP} if access.sees_all_tasks else set()
        wanted |= {inbox_group(server_id) for server_id in access.approvable_server_ids}
        for group in sorted(self.groups_joined - wanted):
            self.groups_joined.discard(group)
            await self.hub.leave(group, self.inbox)
        for group in sorted(wanted - self.groups_joined):
            await self._join(group)

    # --- a change -----------------------------------------------------------------------------------------

    async def _change_frames(self, event: dict) -> AsyncIterator[str]:
        """The change's HTML for this socket, in the frames it goes in: the watched task's sections first."""
        task_id = str(event["task_id"])
        message_id = event.get("message_id") or uuid.uuid4().hex  # without an id (not from publish.py): not shared
        server_id = event.get("server_id")
        task = None
        if not isinstance(server_id, int):
            # A message that does not say the task's server: the task is read first (once for all sockets).
            task = await shared(("task", message_id), lambda: on_live_thread(_task_or_none)(task_id))
            server_id = task.server_id if task is not None else None
        access = self.access
        kinds = []
        if server_id is not None:
            if access.sees_all_tasks:
                kinds.append(FragmentKind.TASKS)
            if task_id in self.watched_tasks and access.may_see_tasks_of(server_id):
                kinds += WATCHED_KINDS
            if server_id in access.approvable_server_ids:
                kinds.append(FragmentKind.INBOX)
            if not kinds:
                return  # heard through a group the user has since lost; nothing of it is theirs
        user, language = self.user, self.language

        async def render(missing: list) -> dict:
            parts = [(key[3], key[4]) for key in missing]
            # One trip to a live thread: the task read there (once per change) and the parts rendered.
            htmls = await on_live_thread(_render_change)(task_id, message_id, task, parts, user, access, language)
            return dict(zip(missing, htmls, strict=True))

        # One part per kind and sharing, so a part is rendered once per change for its audience (or user), whatever
        # else the socket asks: the list page's and the detail page's sockets share the list signal and the nav.
        # The watched task's status goes in a frame of its own, first, then the rest of its sections: the page the
        # person is looking at does not wait for its timeline, nor for the list's signal, the nav counts and the inbox
        # (other sockets render those meanwhile, or this one next).
        parts = _parts_of_change(kinds)
        batches = [[part for part in parts if part[0] == kind] for kind in WATCHED_KINDS]
        batches.append([part for part in parts if part[0] not in WATCHED_KINDS])
        for batch in batches:
            keys = [
                (
                    "change",
                    message_id,
                    access,
                    kind,
                    sharing,
                    self.user_id if sharing == Sharing.USER else None,
                    language,
                )
                for kind, sharing in batch
            ]
            if keys:
                yield "".join(await shared_all(keys, render))

    # --- watching one task --------------------------------------------------------------------------------

    async def _watch(self, value) -> None:
        task_id = _as_uuid(value)
        if task_id is None or len(self.watched_tasks) >= MAX_WATCHED_TASKS:
            return
        server_id, html = await on_live_thread(self._render_watched_task)(task_id)
        if server_id is None:
            logger.info("user %s may not watch task %s; refused", self.user_id, task_id)
            return
        await self._join(task_group(task_id))
        self.watched_tasks[str(task_id)] = server_id
        await self._send_html(html)

    async def _unwatch(self, value) -> None:
        task_id = _as_uuid(value)
        if task_id is None or str(task_id) not in self.watched_tasks:
            return
        del self.watched_tasks[str(task_id)]
        self.groups_joined.discard(task_group(task_id))
        await self.hub.leave(task_group(task_id), self.inbox)

    async def _join(self, group: str) -> None:
        self.groups_joined.add(group)
        await self.hub.join(group, self.inbox)

    async def _send_html(self, html: str) -> None:
        if html:
            await self.send(text_data=html)

    def _render_watched_task(self, task_id: uuid.UUID) -> tuple[int | None, str]:
        """(the task's server id, its fragments) if the user may see it now, else (None, "")."""
        user, access = current_access(self.user_id)
        task = _task_or_none(task_id)
        if user is None or task is None or not access.may_see_task(task):
            return None, ""
        with translation.override(self.language):
            return task.server_id, "".join(render_task_fragments(WATCHED_KINDS, task, user))


# --- rendering (sync, on a live thread) -----------------------------------------------------------


def _task_or_none(task_id) -> Task | None:
    """The task whole, with what any page's fragment shows of it (the list signal: who asked to cancel; the detail
    page's facts: its next poll, which would otherwise be a query of its own per change), as
    `select_related("server", "launched_by", "cancel_requested_by", "poll")` reads it, and `asks` (whether it has
    input requests), in a statement written once: the ORM took about 1 ms of CPU to build that one again for every
    change (bench/freshness.py)."""
    try:
        task_id = uuid.UUID(str(task_id))
    except ValueError:
        return None
    with prepared_cursor() as cursor:
        cursor.execute(_task_with_relations_sql(), [task_id])
        row = cursor.fetchone()
    if row is None:
        return None
    user_model = get_user_model()
    task, server, launched_by, cancel_requested_by, poll = raw_rows.instances(
        row[:-1], (Task, Server, user_model, user_model, TaskPoll)
    )
    task.asks = row[-1]  # whether it has input requests, as services' locked reads say (none: the page asks for none)
    raw_rows.relate(task, "server", server)
    raw_rows.relate(task, "launched_by", launched_by if launched_by.pk is not None else None)
    raw_rows.relate(task, "cancel_requested_by", cancel_requested_by if cancel_requested_by.pk is not None else None)
    if poll.pk is None:
        raw_rows.relate(task, "poll", None)  # as select_related leaves a missing one: task.poll raises DoesNotExist
    else:
        raw_rows.relate(task, "poll", poll)
        raw_rows.relate(poll, "task", task)
    return task


@functools.cache
def _task_with_relations_sql() -> str:
    users = get_user_model()._meta.db_table
    selected = [
        *raw_rows.columns("t", Task),
        *raw_rows.columns("s", Server),
        *raw_rows.columns("lb", get_user_model()),
        *raw_rows.columns("cb", get_user_model()),
        *raw_rows.columns("p", TaskPoll),
    ]
    return (
        f"SELECT {', '.join(selected)}, {has_input_requests_sql('t')} "
        f'FROM "{Task._meta.db_table}" t JOIN "{Server._meta.db_table}" s ON s.id = t.server_id '
        f'LEFT JOIN "{users}" lb ON lb.id = t.launched_by_id '
        f'LEFT JOIN "{users}" cb ON cb.id = t.cancel_requested_by_id '
        f'LEFT JOIN "{TaskPoll._meta.db_table}" p ON p.task_id = t.id '
        "WHERE t.id = %s"
    )


def _render_user_fragments(user, access: LiveAccess, sharing: Sharing | None, language: str) -> str:
    with rendering_for(access), translation.override(language):
        return "".join(render_user_fragments(user, sharing=sharing))


def _parts_of_change(kinds: list[FragmentKind]) -> list[tuple[FragmentKind | None, Sharing]]:
    """(kind, sharing) per registered part of a change, in the order they are sent; kind None: the user fragments."""
    return [
        (kind, sharing)
        for sharing in (Sharing.AUDIENCE, Sharing.USER)
        for kind in [*kinds, None]
        if (has_task_fragments([kind], sharing) if kind is not None else has_user_fragments(sharing))
    ]


def _render_change(task_id: str, message_id: str, task, parts, user, access: LiveAccess, language: str) -> list[str]:
    return _render_parts(task or _task_of_change(task_id, message_id), parts, user, access, language=language)


def _render_parts(
    task, parts: list[tuple[FragmentKind | None, Sharing]], user, access: LiveAccess, *, language: str | None = None
) -> list[str]:
    """Each part's HTML in this language (None: the one active; a task's parts are empty once the task is gone)."""
    with rendering_for(access), translation.override(language or translation.get_language()):
        return [
            "".join(
                render_user_fragments(user, sharing=sharing)
                if kind is None
                else render_task_fragments([kind], task, user, sharing=sharing)
                if task is not None
                else []
            )
            for kind, sharing in parts
        ]


# The task as read for a change (by message id), shared by the live threads rendering that change's parts.
TASK_READS_KEPT = 64
_task_reads: OrderedDict[str, Future] = OrderedDict()
_task_reads_lock = threading.Lock()


def _task_of_change(task_id: str, message_id: str):
    with _task_reads_lock:
        read = _task_reads.get(message_id)
        mine = read is None
        if mine:
            read = _task_reads[message_id] = Future()
            while len(_task_reads) > TASK_READS_KEPT:
                _task_reads.popitem(last=False)
    if mine:
        try:
            read.set_result(_task_or_none(task_id))
        except BaseException as error:
            read.set_exception(error)
            with _task_reads_lock:
                if _task_reads.get(message_id) is read:
                    del _task_reads[message_id]
    return read.result()


# --- access read again in the background ------------------------------------------------------------------
#
# A change is pushed only under an access read in the last ACCESS_MAX_AGE_SECONDS. Read on the change's path,
# that made the first change after a quiet spell wait for every socket's read and session check (a second at
# 2,000 sockets: bench/fanout.py). Each process therefore reads its sockets' access again before it gets that old,
# all together (one read per user, the sessions in batches), and a change finds it fresh.
ACCESS_REFRESH_AFTER_SECONDS = ACCESS_MAX_AGE_SECONDS / 2
ACCESS_SWEEP_SECONDS = ACCESS_MAX_AGE_SECONDS / 6


class _AccessRefresh:
    def __init__(self) -> None:
        self.sockets: weakref.WeakSet[LiveConsumer] = weakref.WeakSet()
        self.task: asyncio.Task | None = None


_access_refreshes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AccessRefresh] = weakref.WeakKeyDictionary()
_NO_SOCKETS = _AccessRefresh()


def _refreshed_in_background(socket: LiveConsumer) -> None:
    loop = asyncio.get_running_loop()
    refresh = _access_refreshes.get(loop)
    if refresh is None:
        refresh = _access_refreshes[loop] = _AccessRefresh()
    refresh.sockets.add(socket)
    if refresh.task is None or refresh.task.done():
        refresh.task = loop.create_task(_sweep_access(refresh), name="live access refresh")


async def _sweep_access(refresh: _AccessRefresh) -> None:
    loop = asyncio.get_running_loop()
    while refresh.sockets:
        await asyncio.sleep(ACCESS_SWEEP_SECONDS)
        now = loop.time()
        due = [socket for socket in refresh.sockets if now - socket.access_read_at > ACCESS_REFRESH_AFTER_SECONDS]
        if not due:
            continue
        results = await asyncio.gather(*(socket._read_access(since=now) for socket in due), return_exceptions=True)
        failed = [result for result in results if isinstance(result, Exception)]
        if failed:  # the change's own check reads it again: nothing is pushed under an access too old
            logger.warning("live: reading the access of %d socket(s) again failed: %r", len(failed), failed[0])


# Per loop: the sessions asked about in this turn of the loop, checked together in one trip to a live thread.
_session_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list] = weakref.WeakKeyDictionary()


async def _session_expiry_in_batch(session_key: str | None, user_id: int):
    loop = asyncio.get_running_loop()
    batch = _session_batches.get(loop)
    if batch is None:
        batch = _session_batches[loop] = []
        loop.call_soon(_check_sessions, loop)  # once the sockets woken with this one have asked too
    answer = loop.create_future()
    batch.append((session_key, user_id, answer))
    return await answer


def _check_sessions(loop: asyncio.AbstractEventLoop) -> None:
    batch = _session_batches.pop(loop, [])

    async def check() -> None:
        try:
            expiries = await on_live_thread(session_expiries)([(key, user_id) for key, user_id, _ in batch])
        except Exception as error:
            expiries = [error] * len(batch)
        for (_, _, answer), expiry in zip(batch, expiries, strict=True):
            if answer.done():
                continue
            if isinstance(expiry, Exception):
                answer.set_exception(expiry)
            else:
                answer.set_result(expiry)

    # Kept until done: the loop holds only a weak reference to a task.
    _session_checks.add(task := loop.create_task(check()))
    task.add_done_callback(_session_checks.discard)


_session_checks: set[asyncio.Task] = set()


def _as_uuid(value) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
