"""The progress a server reports on a call this worker holds open, written for the pages at a bounded rate."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from taskhub.tasks.services.progress import record_progress
from taskhub.worker.orm import db

logger = logging.getLogger(__name__)

# At most one write (and one live update) per call this often, however fast the server reports: the latest wins.
WRITE_EVERY_SECONDS = 0.5


class CallProgress:
    """`on_progress` for `TasksClient.call_tool`; `await aclose()` once the call has returned."""

    def __init__(self, task_id: uuid.UUID) -> None:
        self.task_id = task_id
        self._latest: tuple[float, float | None, str | None] | None = None
        self._written: tuple[float, float | None, str | None] | None = None
        self._changed = asyncio.Event()
        self._writer: asyncio.Task | None = None

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self._latest = (progress, total, message)
        self._changed.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop(), name=f"progress of {self.task_id}")

    async def _write_loop(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self._write()
            await asyncio.sleep(WRITE_EVERY_SECONDS)

    async def _write(self) -> None:
        latest = self._latest
        if latest is None or latest == self._written:
            return
        progress, total, message = latest
        try:
            await db(record_progress, task_id=self.task_id, progress=progress, total=total, message=message)
        except Exception:  # a lost progress tick is no reason to fail the call
            logger.warning("task %s: storing its progress failed", self.task_id, exc_info=True)
        self._written = latest

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            await self._write()  # the last one reported
