"""The worker's liveness signal for container health checks: a file it touches while it is well.

`manage.py worker` touches TASKHUB_WORKER_HEALTH_FILE every TASKHUB_WORKER_HEALTH_SECONDS, each time after a
round trip to the database on its job connection, and removes it when it stops. `taskhub healthcheck worker` (no
Django, no database: cheap enough to run every few seconds) passes while the file is younger than
STALE_AFTER_BEATS beats: a worker that hangs, loses its database or dies stops touching it and fails the check.

The file is this module's alone (not the tracker's leases nor procrastinate's heartbeat rows), so that how workers
take over each other's work can change without changing what a container's health means. Unset, nothing is written
(`taskhub demo`, tests that do not ask for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

HEALTH_FILE_ENV = "TASKHUB_WORKER_HEALTH_FILE"
HEALTH_SECONDS_ENV = "TASKHUB_WORKER_HEALTH_SECONDS"
DEFAULT_HEALTH_SECONDS = 10.0
# Missed beats before the worker counts as unhealthy: one late beat (a slow database round trip) is not a failure.
STALE_AFTER_BEATS = 3

logger = logging.getLogger(__name__)


def health_file(environ=os.environ) -> Path | None:
    value = environ.get(HEALTH_FILE_ENV, "").strip()
    return Path(value) if value else None


def health_seconds(environ=os.environ) -> float:
    return float(environ.get(HEALTH_SECONDS_ENV, "").strip() or DEFAULT_HEALTH_SECONDS)


async def beat(*, stop: asyncio.Event, is_well: Callable[[], Awaitable[None]], environ=os.environ) -> None:
    """Touch the health file every beat while `is_well()` returns (it raises when not), until `stop`; then remove
    the file, so a stopped worker fails the check at once."""
    path, seconds = health_file(environ), health_seconds(environ)
    if path is None:
        return
    well = True
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(is_well(), timeout=seconds)
            except Exception as error:  # any failure is "not well": the file ages, the check fails
                if well:  # once, not every beat
                    logger.warning("worker health: not well (%r); %s is no longer touched", error, path)
                well = False
            else:
                await asyncio.to_thread(_touch, path)
                if not well:
                    logger.warning("worker health: well again; %s is touched again", path)
                well = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=seconds)
    finally:
        path.unlink(missing_ok=True)


def _touch(path: Path) -> None:
    path.touch()
    os.utime(path)


def check(environ=os.environ, *, now: float | None = None) -> tuple[bool, str]:
    """(healthy, why): whether this host's worker touched its health file recently enough."""
    path, seconds = health_file(environ), health_seconds(environ)
    if path is None:
        return False, f"{HEALTH_FILE_ENV} is not set: the worker writes no health file"
    try:
        touched = path.stat().st_mtime
    except FileNotFoundError:
        return False, f"no health file at {path}: the worker is not running (or not well yet)"
    age = (time.time() if now is None else now) - touched
    limit = STALE_AFTER_BEATS * seconds
    if age > limit:
        return False, f"the worker last touched {path} {age:.0f} s ago (more than {limit:g} s)"
    return True, f"the worker touched {path} {max(age, 0):.1f} s ago"
