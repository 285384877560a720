"""The live socket, /ws/live/: pushes htmx out-of-band fragments to a signed-in user's pages.

Permissions are checked here, not only in views: the groups joined on connect follow the user's
roles, a {"watch": "<task uuid>"} is granted only for a task the user may see, and every change is
rendered with the user's access read fresh from the database.
"""

import asyncio
import json
import logging
import uuid
from collections import deque

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import get_user_model

from taskhub.accounts import permissions
from taskhub.live import publish
from taskhub.live.access import NO_ACCESS, LiveAccess, access_for
from taskhub.live.fragments import FragmentKind, render_task_fragments, render_user_fragments
from taskhub.live.groups import TASKS_GROUP, inbox_group, task_group

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
        self.user_id = user.pk
        self.groups_joined: set[str] = set()
        self.watched_task_ids: set[str] = set()
        self.recent_message_ids: deque[str] = deque(maxlen=REMEMBERED_MESSAGES)
        publish.remember_consumer_loop(asyncio.get_running_loop())

        access = await database_sync_to_async(access_for)(user)
        groups = [TASKS_GROUP] if access.sees_all_tasks else []
        groups += [inbox_group(server_id) for server_id in sorted(access.approvable_server_ids)]
        for group in groups:
            await self._join(group)
        await self.accept()
        # On every (re)connect: the current state from the database, since messages missed meanwhile are lost.
        await self._send_html(await database_sync_to_async(self._render_user_fragments)())

    async def disconnect(self, code):
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
        allowed, html = await database_sync_to_async(self._render_change)(event["task_id"], set(self.watched_task_ids))
        if not allowed:
            await self.close(code=CLOSE_NO_LONGER_ALLOWED)
            return
        await self._send_html(html)

    # --- watching one task --------------------------------------------------------------------------------

    async def _watch(self, value) -> None:
        task_id = _as_uuid(value)
        if task_id is None or len(self.watched_task_ids) >= MAX_WATCHED_TASKS:
            return
        allowed, html = await database_sync_to_async(self._render_watched_task)(task_id)
        if not allowed:
            logger.info("user %s may not watch task %s; refused", self.user_id, task_id)
            return
        await self._join(task_group(task_id))
        self.watched_task_ids.add(str(task_id))
        await self._send_html(html)

    async def _unwatch(self, value) -> None:
        task_id = _as_uuid(value)
        if task_id is None or str(task_id) not in self.watched_task_ids:
            return
        self.watched_task_ids.discard(str(task_id))
        self.groups_joined.discard(task_group(task_id))
        await self.channel_layer.group_discard(task_group(task_id), self.channel_name)

    async def _join(self, group: str) -> None:
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)

    async def _send_html(self, html: str) -> None:
        if html:
            await self.send(text_data=html)

    # --- rendering (sync, in a thread: database access) ---------------------------------------------------

    def _current_user_and_access(self) -> tuple[object | None, LiveAccess]:
        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        if user is None:
            return None, NO_ACCESS
        # A fresh user object per message: its roles are read once here, not by every fragment again.
        return permissions.with_roles_read_once(user), access_for(user)

    def _render_user_fragments(self) -> str:
        user, _ = self._current_user_and_access()
        return "".join(render_user_fragments(user)) if user is not None else ""

    def _render_watched_task(self, task_id: uuid.UUID) -> tuple[bool, str]:
        from taskhub.tasks.models import Task

        user, access = self._current_user_and_access()
        task = Task.objects.select_related("server").filter(pk=task_id).first()
        if user is None or task is None or not access.may_see_task(task):
            return False, ""
        return True, "".join(render_task_fragments([FragmentKind.TASK], task, user))

    def _render_change(self, task_id: str, watched_task_ids: set[str]) -> tuple[bool, str]:
        from taskhub.tasks.models import Task

        user, access = self._current_user_and_access()
        if user is None:
            return False, ""
        task = Task.objects.select_related("server").filter(pk=task_id).first()
        kinds = []
        if task is not None:
            if access.sees_all_tasks:
                kinds.append(FragmentKind.TASKS)
            if str(task.pk) in watched_task_ids and access.may_see_task(task):
                kinds.append(FragmentKind.TASK)
            if task.server_id in access.approvable_server_ids:
                kinds.append(FragmentKind.INBOX)
        if task is not None and not kinds:
            return True, ""  # heard through a group the user has since lost; nothing of it is theirs
        fragments = render_task_fragments(kinds, task, user) if kinds else []
        return True, "".join([*fragments, *render_user_fragments(user)])


def _as_uuid(value) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
