"""ORM calls from the worker's async code (jobs, sweeps, held questions)."""

from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection


async def db[R](function: Callable[..., R], /, **kwargs: Any) -> R:
    """Run ORM code from a job. A long-lived worker must drop connections that died (e.g. a Postgres restart)."""

    def call() -> R:
        if not connection.in_atomic_block:
            close_old_connections()
        return function(**kwargs)

    return await sync_to_async(call)()
