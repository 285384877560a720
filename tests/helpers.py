"""Small helpers shared by the tests: a free port, waiting for an event, letting time pass where time passing is what
a test is about, a task snapshot as a server sends it.

Plain functions, imported by name. Shared fixtures are not imported: conftest.py loads their modules as plugins.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

from taskhub.mcp.wire import TaskSnapshot

CREATED_AT = "2026-07-28T10:00:00Z"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until[T](predicate: Callable[[], T], *, what: str, timeout: float = 30, interval: float = 0.05) -> T:
    """The first truthy value of `predicate()`, polled every `interval` seconds; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def let_time_pass(seconds: float, *, because: str) -> None:
    """Sleep, where the time passing is itself what a test is about (an idle connection outliving a timeout) and
    no event marks its end. Anything else waits for its event (`wait_until`). `because` says why, for the reader."""
    time.sleep(seconds)


async def let_time_pass_async(seconds: float, *, because: str) -> None:
    """`let_time_pass` on an event loop: a pause that is itself the subject (a simulated person's pace)."""
    await asyncio.sleep(seconds)


def snapshot(
    status: str = "working",
    *,
    task_id: str = "remote-1",
    created_at: str | None = CREATED_AT,
    last_updated_at: str | None = None,
    ttl_ms: int | None = 60_000,
    **fields: Any,
) -> TaskSnapshot:
    """A `DetailedTask` as a server would send it. `fields` are further wire fields by their wire names
    (statusMessage, inputRequests, result, ...); a keyword set to None leaves its field out."""
    wire = {"taskId": task_id, "status": status, "createdAt": created_at, "lastUpdatedAt": last_updated_at}
    wire["ttlMs"] = ttl_ms
    wire = {key: value for key, value in wire.items() if value is not None}
    return TaskSnapshot.model_validate({**wire, **fields})
