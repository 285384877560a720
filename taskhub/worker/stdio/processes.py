"""One stdio server's long-lived process in the worker that holds its lease: its client, restarts, and its page.

The `StdioProcess` is the `TasksClient` every job and the tracker use for the server (so that `tasks/get` reaches
the process that created the task), and watches the process through the client's `ProcessObserver` hooks:

- started: its pid and start time are stored (the server page shows them; the tracker compares a task's launch
  time with the start time to tell a task of an earlier process, `services.mark_lost`);
- stderr: the last `STDERR_TAIL_LINES` lines, redacted by the transport, capped, stored at most once a second;
- exited: the exit is stored, and the process is started again after a backoff that doubles while it keeps
  dying young (`RESTART_FIRST_SECONDS` .. `RESTART_CAP_SECONDS`). Until then a request is refused at once
  (a transport error: jobs and polls back off and retry) instead of starting a process in a loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from taskhub.backoff import exponential
from taskhub.mcp.client import StdioTarget, TasksClient
from taskhub.mcp.errors import TransportError
from taskhub.servers.models import STDERR_TAIL_LINE_CHARS, STDERR_TAIL_LINES, ProcessState, ServerProcess
from taskhub.worker.waiting import wait

logger = logging.getLogger(__name__)

RESTART_FIRST_SECONDS = 1.0
RESTART_CAP_SECONDS = 60.0
# A process that ran this long before it exited was healthy: its restart waits the first backoff again.
HEALTHY_SECONDS = 30.0
STORE_EVERY_SECONDS = 1.0
# How long a request may take on the process (tools/call has its own, longer timeout: jobs pass it per request).
REQUEST_TIMEOUT_SECONDS = 30.0


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "exited"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _store(server_id: int, owner: str, fields: dict[str, Any]) -> None:
    close_old_connections()
    ServerProcess.objects.filter(server_id=server_id, lease_owner=owner).update(**fields, updated_at=timezone.now())


class StdioProcess:
    """The process of one stdio server, kept running by `keep` until stopped."""

    def __init__(self, *, server_id: int, target: StdioTarget, owner: str, timeout: float = REQUEST_TIMEOUT_SECONDS):
        self.server_id = server_id
        self.target = target
        self.owner = owner
        self.client = TasksClient(target, timeout=timeout, observer=self)
        self.pid: int | None = None
        self.started_at: datetime | None = None
        self.last_exit = ""
        self.restarts = 0
        self._deaths_in_row = 0
        self._next_start = 0.0  # loop time
        self._starting = False
        self._closing = False
        self._exited = asyncio.Event()
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._pending: dict[str, Any] = {}
        self._dirty = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    async def use_target(self, target: StdioTarget) -> None:
        """The same process under changed settings of what taskhub answers by itself (its roots, sampling)."""
        self.target = target
        await self.client.use_own_answers(target.own_answers)

    # -- the observer hooks (called by the stdio transport) -------------------------------------------------

    async def before_start(self) -> None:
        if self._closing:
            raise TransportError(f"{self.target.describe()}: the server's process is being stopped")
        wait = self._next_start - self._loop.time()
        if wait > 0:
            raise TransportError(
                f"{self.target.describe()}: the server's process {self.last_exit}; it is started again in {wait:.0f} s"
            )
        self._starting = True
        self._note(state=ProcessState.STARTING)

    def started(self, pid: int) -> None:
        self._starting = False
        self.pid, self.started_at = pid, timezone.now()
        self._exited.clear()
        logger.info("stdio server %s: process %s started", self.server_id, pid)
        self._note(state=ProcessState.RUNNING, pid=pid, started_at=self.started_at, next_start_at=None)

    def stderr_line(self, text: str) -> None:
        text = text.replace("\x00", "\ufffd")  # Postgres cannot store a NUL in JSON text
        if len(text) > STDERR_TAIL_LINE_CHARS:
            text = text[: STDERR_TAIL_LINE_CHARS - 1] + "…"
        self._stderr.append(text)
        self._note(stderr_tail=list(self._stderr))

    def exited(self, returncode: int | None) -> None:
        self._died(describe_exit(returncode))

    def _died(self, how: str) -> None:
        how = how.replace("\x00", "\ufffd")
        ran = (timezone.now() - self.started_at).total_seconds() if self.started_at and self.pid else 0.0
        self.pid = None
        self.last_exit = how
        self._exited.set()
        if self._closing:
            self._note(state=ProcessState.STOPPED, pid=None, last_exit=how, last_exit_at=timezone.now())
            return
        self._deaths_in_row = 1 if ran >= HEALTHY_SECONDS else self._deaths_in_row + 1
        backoff = exponential(self._deaths_in_row - 1, first=RESTART_FIRST_SECONDS, cap=RESTART_CAP_SECONDS)
        self._next_start = self._loop.time() + backoff
        self.restarts += 1
        logger.warning("stdio server %s: process %s; starting it again in %g s", self.server_id, how, backoff)
        self._note(
            state=ProcessState.RESTARTING,
            pid=None,
            last_exit=how,
            last_exit_at=timezone.now(),
            restarts=self.restarts,
            next_start_at=timezone.now() + timezone.timedelta(seconds=backoff),
        )

    # -- keeping it running -------------------------------------------------------------------------------------

    async def keep(self, stop: asyncio.Event) -> None:
        """Start the process, and again (after the backoff) whenever it exits, until `stop`; then stop it."""
        storing = asyncio.create_task(self._store_loop(), name=f"stdio-store-{self.server_id}")
        try:
            while not stop.is_set():
                if self.pid is None:
                    delay = self._next_start - self._loop.time()
                    if delay > 0 and await wait(stop, delay):
                        break
                    try:
                        await self.client.discover()  # starts the process (the SDK negotiates), and checks it answers
                    except Exception as error:
                        if self._starting:  # it could not even be started (no such command, …)
                            self._starting = False
                            self._died(f"could not be started: {error}"[:200])
                        elif self.pid is None and not self._exited.is_set():
                            self._died(f"failed: {error}"[:200])
                        else:
                            logger.info("stdio server %s: discover failed: %s", self.server_id, error)
                if self.pid is not None:
                    await wait(stop, 3600, self._exited)
                    if self._exited.is_set() and not stop.is_set():
                        # Its connection is dead: dropped, so that the next request starts the next process.
                        with contextlib.suppress(Exception):
                            await self.client.aclose()
        finally:
            self._closing = True
            with contextlib.suppress(Exception):
                await self.client.aclose()
            self._dirty.set()
            storing.cancel()
            with contextlib.suppress(BaseException):
                await storing
            with contextlib.suppress(Exception):
                await self._flush()

    def kill(self) -> None:
        """SIGKILL to the process's group (it was started in a session of its own: its group id is its pid)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
                logger.warning("stdio server %s: process group %s killed", self.server_id, self.pid)

    # -- the page's record ---------------------------------------------------------------------------------------

    def _note(self, **fields: Any) -> None:
        self._pending.update(fields)
        self._dirty.set()

    async def _flush(self) -> None:
        fields, self._pending = self._pending, {}
        if fields:
            try:
                await sync_to_async(_store)(self.server_id, self.owner, fields)
            except Exception:
                self._pending = {**fields, **self._pending}
                raise

    async def _store_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._flush()
            except Exception:
                logger.exception("stdio server %s: storing the process's state failed", self.server_id)
            await asyncio.sleep(STORE_EVERY_SECONDS)
