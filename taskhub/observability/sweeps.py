"""The periodic job that folds the rows of changes of the counts (counts.py: tasks, input requests, leases, poll
failures), so that they stay few between scrapes of /metrics, and where nothing scrapes at all. Listed in
PROCRASTINATE_IMPORT_PATHS."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection
from procrastinate.contrib.django import app

from taskhub.observability import counts


def _fold() -> bool:
    if not connection.in_atomic_block:
        close_old_connections()  # a long-lived worker drops connections that died
    return counts.fold()


@app.periodic(cron="*/5 * * * *")
@app.task(name="taskhub.fold_task_counts", queueing_lock="taskhub.fold_task_counts")
async def fold_task_counts(timestamp: int) -> bool:
    return await sync_to_async(_fold)()
