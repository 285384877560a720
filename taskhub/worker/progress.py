"""The progress and log lines a server reports on a call this worker holds open, written for the pages at a bounded
rate."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from typing import Any

from django.utils import timezone

from taskhub.tasks.services.progress import LogLine, record_progress, record_server_log, summarise_server_log
from taskhub.worker.orm import db

logger = logging.getLogger(__name__)

# At most one write (and one live update) per call this often, however fast the server reports: the latest wins.
WRITE_EVERY_SECONDS = 0.5


class _Batched:
    """What a call reports, written on a task of its own at most every WRITE_EVERY_SECONDS (`_write`: the subclass's);
    `_stop` once the call has returned writes what is left."""

    def __init__(self, task_id: uuid.UUID, what: str) -> None:
        self.task_id = task_id
        self._what = what
        self._changed = asyncio.Event()
        self._writer: asyncio.Task | None = None

    def _reported(self) -> None:
        self._changed.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop(), name=f"{self._what} of {self.task_id}")

    async def _write_loop(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self._write()
            await asyncio.sleep(WRITE_EVERY_SECONDS)

    async def _write(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        await self._write()  # the last reported


class CallProgress(_Batched):
    """`on_progress` for `TasksClient.call_tool`; `await aclose()` once the call has returned. `store`: how the writes
    run (the worker's `db`; the gateway's pool of threads for a call it sends itself)."""

    def __init__(self, task_id: uuid.UUID, *, store=db) -> None:
        super().__init__(task_id, "progress")
        self._store = store
        self._latest: tuple[float, float | None, str | None] | None = None
        self._written: tuple[float, float | None, str | None] | None = None

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self._latest = (progress, total, message)
        self._reported()

    async def _write(self) -> None:
        latest = self._latest
        if latest is None or latest == self._written:
            return
        progress, total, message = latest
        try:
            await self._store(record_progress, task_id=self.task_id, progress=progress, total=total, message=message)
        except Exception:  # a lost progress tick is no reason to fail the call
            logger.warning("task %s: storing its progress failed", self.task_id, exc_info=True)
        self._written = latest

    async def aclose(self) -> None:
        await self._stop()


# What a server may log into a task's page: a burst of LOG_BURST lines, then LOG_LINES_PER_SECOND; the rest is counted
# as dropped (the call's audit summary says how many).
LOG_LINES_PER_SECOND = 10
LOG_BURST = 50


class CallLog(_Batched):
    """`on_log` for a call this worker holds open: the server's log lines, rate-limited, written in batches at most
    every WRITE_EVERY_SECONDS; `await aclose()` once the call (or the 2025-11-25 task it made) has ended writes the
    rest and the call's one audit row."""

    def __init__(self, task_id: uuid.UUID) -> None:
        super().__init__(task_id, "server log")
        self._pending: list[LogLine] = []
        self._levels: collections.Counter[str] = collections.Counter()
        self._lines = 0
        self._dropped = 0
        self._tokens = float(LOG_BURST)
        self._refilled = time.monotonic()

    def __call__(self, level: str, logger_name: str | None, data: Any) -> None:
        now = time.monotonic()
        self._tokens = min(float(LOG_BURST), self._tokens + (now - self._refilled) * LOG_LINES_PER_SECOND)
        self._refilled = now
        if self._tokens < 1:
            self._dropped += 1
            return
        self._tokens -= 1
        self._lines += 1
        self._levels[level[:20]] += 1
        self._pending.append(LogLine(at=timezone.now(), level=level, logger=logger_name or "", data=data))
        self._reported()

    async def _write(self) -> None:
        lines, self._pending = self._pending, []
        if not lines:
            return
        try:
            await db(record_server_log, task_id=self.task_id, lines=lines)
        except Exception:  # a lost log line is no reason to fail the call
            logger.warning("task %s: storing its server's log lines failed", self.task_id, exc_info=True)

    async def aclose(self) -> None:
        await self._stop()
        if self._lines or self._dropped:
            try:
                await db(
                    summarise_server_log,
                    task_id=self.task_id,
                    lines=self._lines,
                    dropped=self._dropped,
                    levels=dict(self._levels),
                )
            except Exception:
                logger.warning("task %s: summarising its server's log failed", self.task_id, exc_info=True)
