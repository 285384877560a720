"""One membership per process and group: the live sockets of a process join their groups through its hub.

With a membership per socket, channels_redis's core layer turns one group_send into one Redis message per member
socket, which daphne's receive loop then pops one round trip at a time: 1,000 sockets of a process cost 1,000
messages per change, before any rendering (bench/fanout.py, its baseline). The hub is in each group once for
all the process's sockets in it, on a channel of its own, and hands each message to those sockets in memory: one
message per process and group.

A message names its group (publish.py adds "group"): the channel layer does not say which group a message came
through. When the hub cannot read from the layer (Redis went away), it closes every socket it serves with 4012;
the pages reconnect, join again (a new hub) and re-read their state, as after any lost message.
"""

import asyncio
import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable

from taskhub.live.groups import task_group

logger = logging.getLogger(__name__)

# channels_redis forgets a membership after its group_expiry (a day by default): the hub's outlive sockets.
REFRESH_SECONDS = 3600.0
HUB_LOST = "hub.lost"  # put in the inboxes of a stopped hub: LiveConsumer.hub_lost closes the socket
WATCHERS_HANDED_KEPT = 256  # a change's copies (one per group) come within milliseconds of each other

Inbox = asyncio.Queue

_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, "Hub"]] = weakref.WeakKeyDictionary()


def hub_for(layer) -> "Hub":
    """The running loop's hub on this channel layer (started on first use)."""
    hubs = _hubs.setdefault(asyncio.get_running_loop(), {})
    hub = hubs.get(id(layer))
    if hub is None or hub.stopped or hub.layer is not layer:
        hub = hubs[id(layer)] = Hub(layer)
    return hub


class Hub:
    def __init__(self, layer) -> None:
        self.layer = layer
        self.members: dict[str, set[Inbox]] = {}
        self.stopped = False
        self._channel: asyncio.Task | None = None
        self._changes: dict[str, asyncio.Task] = {}  # per group: its latest group_add / group_discard
        self._reader: asyncio.Task | None = None
        self._refresher: asyncio.Task | None = None
        # Per recent change (its message id): the inboxes watching its task that were handed it (_inboxes_for).
        self._watchers_handed: OrderedDict[str, set[Inbox]] = OrderedDict()

    async def join(self, group: str, inbox: Inbox) -> None:
        """From now on (once this returns) the group's messages reach this inbox."""
        members = self.members.setdefault(group, set())
        members.add(inbox)
        if len(members) == 1:
            self._change(group, self.layer.group_add)
        await asyncio.shield(self._changes[group])

    async def leave(self, group: str, inbox: Inbox) -> None:
        members = self.members.get(group)
        if members is None or inbox not in members:
            return
        members.discard(inbox)
        if not members:
            del self.members[group]
            self._change(group, self.layer.group_discard)

    def _change(self, group: str, change: Callable) -> None:
        # One group's adds and discards reach the layer in the order they were asked for.
        previous = self._changes.get(group)
        task = asyncio.get_running_loop().create_task(self._after(previous, group, change))
        self._changes[group] = task
        task.add_done_callback(lambda done: self._forget_change(group, done))

    async def _after(self, previous: asyncio.Task | None, group: str, change: Callable) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        await change(group, await self._channel_name())

    def _forget_change(self, group: str, done: asyncio.Task) -> None:
        if self._changes.get(group) is done and group not in self.members:
            del self._changes[group]
        if not done.cancelled() and done.exception() is not None:
            self._stop(done.exception())

    async def _channel_name(self) -> str:
        if self._channel is None:
            self._channel = asyncio.get_running_loop().create_task(self._open())
        return await asyncio.shield(self._channel)

    async def _open(self) -> str:
        channel = await self.layer.new_channel()
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read(channel))
        self._refresher = loop.create_task(self._refresh(channel))
        return channel

    async def _read(self, channel: str) -> None:
        try:
            while True:
                message = await self.layer.receive(channel)
                for inbox in self._inboxes_for(message):
                    inbox.put_nowait(message)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._stop(error)

    def _inboxes_for(self, message: dict) -> list[Inbox]:
        """The inboxes of the message's group; for a task's change, first those watching the task (in its group) that
        were not handed it by an earlier copy (publish.py sends a change to each of its groups)."""
        members = self.members.get(message.get("group"), set())
        task_id = message.get("task_id")
        watching = self.members.get(task_group(task_id), set()) if task_id else set()
        if not watching:
            return list(members)
        # The sockets handed a change first ask first for their rendering, which the live thread does in turn
        # (threads.py): the page that shows the task waited behind other pages' list signal and nav counts
        # (bench/freshness.py: stored → the detail page's socket frame). Being in the task's group, a watcher is
        # granted its changes (consumer._watch; the gateway's waits): it is handed the change by its first copy,
        # whichever group that came through, and not by the others.
        message_id = message.get("message_id")
        handed = self._watchers_handed.get(message_id, set()) if message_id is not None else set()
        first = [inbox for inbox in watching if inbox not in handed]
        if first and message_id is not None:
            self._watchers_handed[message_id] = handed.union(first)
            while len(self._watchers_handed) > WATCHERS_HANDED_KEPT:
                self._watchers_handed.popitem(last=False)
        return [*first, *(inbox for inbox in members if inbox not in watching)]

    async def _refresh(self, channel: str) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                for group in list(self.members):
                    await self.layer.group_add(group, channel)
            except Exception as error:
                self._stop(error)
                return

    def _stop(self, error: BaseException) -> None:
        if self.stopped:
            return
        self.stopped = True
        logger.warning("live hub stopped (%s); its %d groups' sockets are closed", error, len(self.members))
        inboxes = {inbox for members in self.members.values() for inbox in members}
        self.members.clear()
        for inbox in inboxes:
            inbox.put_nowait({"type": HUB_LOST})
        for task in (self._reader, self._refresher):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
