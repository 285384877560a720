"""The live socket, /ws/live/: pushes htmx out-of-band fragments to a signed-in user's pages.

Permissions are checked here, not only in views: the groups joined follow the user's access (read on
connect, again when told it changed, and at the latest every ACCESS_MAX_AGE_SECONDS), a {"watch": "<task
uuid>"} is granted only for a task the user may see, and a change is rendered for the socket's own access.

One change reaches every socket of the process that hears it, so its rendering is shared (sharing.py):
the task is read once, fragments of Sharing.AUDIENCE are rendered once per access (the same bytes for
every socket whose user may see the same), those of Sharing.USER once per user.
"""

import asyncio
import json
import logging
import uuid
from collections import deque

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.utils import timezone

from taskhub.live import publish
from taskhub.live.access import (
    ACCESS_MAX_AGE_SECONDS,
    NO_ACCESS,
    LiveAccess,
    connected_access,
    current_access,
    rendering_for,
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
from taskhub.live.sharing import shared
from taskhub.live.threads import on_live_thread

logger = logging.getLogger(__name__)

# Application close codes (4000-4999). The htmx ws extension reconnects only after 1006/1011/1012/1013,
# so a refused socket is not retried in a loop.
CLOSE_NOT_SIGNED_IN = 4401
CLOSE_NO_LONGER_ALLOWED = 4403
MAX_WATCHED_TASKS = 200
# One change reaches a connection once per group it shares (tasks, task.<id>, inbox.server.<id>).
REMEMBERED_MESSAGES = 256


class LiveConsumer(AsyncWebsocketConsumer):
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
        # On every (re)connect: the current state from the database, since messages missed meanwhile are lost.
        # Sockets of one audience connecting together share a rendering begun after they joined their groups.
        audience_html = await shared(
            ("connect", self.access),
            lambda: on_live_thread(_render_user_fragments)(self.user, self.access, Sharing.AUDIENCE),
            started_after=loop.time(),
        )
        user_html = ""
        if has_user_fragments(Sharing.USER):
            user_html = await on_live_thread(_render_user_fragments)(self.user, self.access, Sharing.USER)
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
        if getattr(self, "session_timer", None) is not None:
            self.session_timer.cancel()
        for group in list(getattr(self, "groups_joined", ())):
            try:
                await self.channel_layer.group_discard(group, self.channel_name)
            except Exception:
                logger.warning("could not leave live group %s", group, exc_info=True)

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

    async def task_changed(self, event):
        if event.get("message_id") in self.recent_message_ids:
            return
        self.recent_message_ids.append(event.get("message_id"))
        now = asyncio.get_running_loop().time()
        # A read begun in the last second (by a socket of the same user hearing this change) is fresh enough.
        if now - self.access_read_at > ACCESS_MAX_AGE_SECONDS and not await self._read_access(since=now - 1):
            return
        await self._send_html(await self._change_html(event["task_id"], event.get("message_id")))

    async def access_changed(self, event):
        before = self.access
        if await self._read_access(since=asyncio.get_running_loop().time()) and self.access != before:
            # What the nav counts count changed with it (rare: not worth sharing).
            await self._send_html(await on_live_thread(_render_user_fragments)(self.user, self.access, None))

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
            lambda: on_live_thread(session_expiry)(self.session_key, self.user_id),
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
            await self.channel_layer.group_discard(group, self.channel_name)
        for group in sorted(wanted - self.groups_joined):
            await self._join(group)

    # --- a change -----------------------------------------------------------------------------------------

    async def _change_html(self, task_id: str, message_id: str | None) -> str:
        message_id = message_id or uuid.uuid4().hex  # without an id (not from publish.py): nothing to share
        task = await shared(("task", message_id), lambda: on_live_thread(_task_or_none)(task_id))
        access = self.access
        kinds = []
        if task is not None:
            if access.sees_all_tasks:
                kinds.append(FragmentKind.TASKS)
            if str(task.pk) in self.watched_tasks and access.may_see_task(task):
                kinds.append(FragmentKind.TASK)
            if task.server_id in access.approvable_server_ids:
                kinds.append(FragmentKind.INBOX)
            if not kinds:
                return ""  # heard through a group the user has since lost; nothing of it is theirs
        kinds = tuple(kinds)
        user = self.user
        html = await shared(
            ("audience", message_id, access, kinds),
            lambda: on_live_thread(_render_change)(task, kinds, user, access, Sharing.AUDIENCE),
        )
        if has_task_fragments(kinds, Sharing.USER) or has_user_fragments(Sharing.USER):
            html += await shared(
                ("user", message_id, self.user_id, access, kinds),
                lambda: on_live_thread(_render_change)(task, kinds, user, access, Sharing.USER),
            )
        return html

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
        await self.channel_layer.group_discard(task_group(task_id), self.channel_name)

    async def _join(self, group: str) -> None:
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)

    async def _send_html(self, html: str) -> None:
        if html:
            await self.send(text_data=html)

    def _render_watched_task(self, task_id: uuid.UUID) -> tuple[int | None, str]:
        """(the task's server id, its fragments) if the user may see it now, else (None, "")."""
        user, access = current_access(self.user_id)
        task = _task_or_none(task_id)
        if user is None or task is None or not access.may_see_task(task):
            return None, ""
        return task.server_id, "".join(render_task_fragments([FragmentKind.TASK], task, user))


# --- rendering (sync, on a live thread) -----------------------------------------------------------


def _task_or_none(task_id):
    from taskhub.tasks.models import Task

    return Task.objects.select_related("server", "launched_by").filter(pk=task_id).first()


def _render_user_fragments(user, access: LiveAccess, sharing: Sharing | None) -> str:
    with rendering_for(access):
        return "".join(render_user_fragments(user, sharing=sharing))


def _render_change(task, kinds: tuple[FragmentKind, ...], user, access: LiveAccess, sharing: Sharing) -> str:
    with rendering_for(access):
        fragments = render_task_fragments(kinds, task, user, sharing=sharing) if task is not None else []
        return "".join([*fragments, *render_user_fragments(user, sharing=sharing)])


def _as_uuid(value) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
