"""`subscriptions/listen` for task notifications.

The SDK's built-in listen handler parses the filter into its core model, which drops the extension's
`taskIds` key, so a listen request that carries `taskIds` is taken by this middleware (it sees the raw params,
before validation); every other listen request goes on to the built-in handler.

Stream: the ack (`notifications/subscriptions/acknowledged` with the accepted task ids) first, then one
`notifications/tasks` with the current state of each accepted task, then one per observable change (status,
statusMessage, inputRequests). When every accepted task has ended (or expired) the server closes the stream
gracefully by answering the listen request.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import require_client_extension
from pydantic import BaseModel, model_serializer

from taskhub.demo.engine import TaskEngine, TaskExpired, TaskNotFound, TaskView
from taskhub.demo.wire import (
    MAX_ID_LENGTH,
    MAX_TASK_IDS_PER_LISTEN,
    SUBSCRIPTION_ID_META_KEY,
    TASKS_EXTENSION,
    invalid_params,
)

logger = logging.getLogger(__name__)

BUFFERED_EVENTS = 256


class RawNotification(BaseModel):
    """A notification sent exactly as given: the session dumps with exclude_none, which would drop `ttlMs: null`."""

    method: str
    params: dict[str, Any]

    @model_serializer
    def _wire(self) -> dict[str, Any]:
        return {"method": self.method, "params": self.params}


def requested_task_ids(params: Mapping[str, Any] | None) -> list[str] | None:
    """The `taskIds` filter of a listen request's raw params, None if it has none; -32602 if malformed."""
    notifications = params.get("notifications") if isinstance(params, Mapping) else None
    if not isinstance(notifications, Mapping) or "taskIds" not in notifications:
        return None
    task_ids = notifications["taskIds"]
    if not isinstance(task_ids, list) or len(task_ids) > MAX_TASK_IDS_PER_LISTEN:
        raise invalid_params(f"notifications.taskIds must be a list of at most {MAX_TASK_IDS_PER_LISTEN} task ids")
    if not all(isinstance(task_id, str) and 0 < len(task_id) <= MAX_ID_LENGTH for task_id in task_ids):
        raise invalid_params("notifications.taskIds must hold task id strings")
    return list(dict.fromkeys(task_ids))


class TaskListenMiddleware:
    def __init__(self, engine: TaskEngine) -> None:
        self._engine = engine

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "subscriptions/listen" or ctx.request_id is None:
            return await call_next(ctx)
        task_ids = requested_task_ids(ctx.params)
        if task_ids is None:
            return await call_next(ctx)
        require_client_extension(ctx, TASKS_EXTENSION)
        return await self._serve(ctx, task_ids)

    async def _serve(self, ctx: ServerRequestContext[Any, Any], task_ids: list[str]) -> dict[str, Any]:
        subscription_id = ctx.request_id
        assert subscription_id is not None
        meta = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        send, receive = anyio.create_memory_object_stream[tuple[str, TaskView | None]](BUFFERED_EVENTS)

        def deliver(task_id: str, view: TaskView | None) -> None:
            try:
                send.send_nowait((task_id, view))
            except anyio.WouldBlock:
                logger.warning("listen stream %r is not being read; ending it", subscription_id)
                send.close()
            except anyio.ClosedResourceError:
                pass

        # Nothing awaits between reading the current states and watching, so no change slips in between.
        current = self._current_views(task_ids)
        unwatch = self._engine.watch(list(current), deliver)
        last_sent: dict[str, dict[str, Any]] = {}

        async def notify(method: str, params: dict[str, Any]) -> None:
            notification = RawNotification(method=method, params={**params, "_meta": meta})
            await ctx.session.send_notification(notification, related_request_id=subscription_id)  # type: ignore[arg-type]

        async def send_task(view: TaskView) -> None:
            wire = view.to_wire()
            if last_sent.get(view.task_id) != wire:
                last_sent[view.task_id] = wire
                await notify("notifications/tasks", wire)

        try:
            await notify("notifications/subscriptions/acknowledged", {"notifications": {"taskIds": list(current)}})
            live = set()
            for view in current.values():
                await send_task(view)
                if not view.phase.terminal:
                    live.add(view.task_id)
            async with receive:
                while live:
                    try:
                        task_id, view = await receive.receive()
                    except anyio.EndOfStream:
                        break
                    if view is not None:
                        await send_task(view)
                    if view is None or view.phase.terminal:
                        live.discard(task_id)
        finally:
            unwatch()
            send.close()
        return {"resultType": "complete", "_meta": meta}

    def _current_views(self, task_ids: list[str]) -> dict[str, TaskView]:
        """The accepted tasks (those that exist and have not expired) with their current state."""
        views: dict[str, TaskView] = {}
        for task_id in task_ids:
            try:
                views[task_id] = self._engine.get(task_id)
            except (TaskNotFound, TaskExpired):
                continue
        return views
