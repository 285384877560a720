"""The tracker's ORM side: the service calls it makes, run in its own small thread pool (never on the event loop)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django import db
from django.db import transaction

from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers import services as server_services
from taskhub.servers.models import Server
from taskhub.tasks import services
from taskhub.tasks.models import Task
from taskhub.worker.tracker.polling import TrackerStats


def in_fresh_connection(work: Callable[[], Any], used: set, stats: TrackerStats) -> Any:
    # These threads see no request cycle, so drop a connection that broke or aged before using it.
    db.close_old_connections()
    connection = db.connections["default"]
    used.add(connection)

    def counted(execute, sql, params, many, context):
        stats.count_orm_statement()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        return work()


def load_target(server_id: int):
    return Server.objects.get(pk=server_id).to_target()


def apply(task_id: uuid.UUID, snapshot: TaskSnapshot, asked_at: datetime | None = None, source: str = "poll") -> bool:
    return services.apply_snapshot(task=Task(pk=task_id), snapshot=snapshot, source=source, asked_at=asked_at)


def mark_lost(task_id: uuid.UUID, process_started_at: datetime) -> bool:
    return services.mark_lost(task=Task(pk=task_id), process_started_at=process_started_at)


def expire(task_id: uuid.UUID) -> bool:
    return services.expire(task=Task(pk=task_id))


def server_failed(server_id: int, error: str) -> None:
    server_services.record_server_failure(server=Server(pk=server_id), error=error)


def server_answered(server_id: int) -> None:
    server_services.record_server_success(server=Server(pk=server_id))


def record_poll_problem(task_id: uuid.UUID, data: dict[str, Any]) -> bool:
    """Put a bad answer on the task's timeline, once per distinct problem in a row."""
    with transaction.atomic():
        task = Task.objects.select_for_update(no_key=True).only("id", "server_id").get(pk=task_id)
        return services.record_protocol_error_once(task=task, data=data)


def close_connections(wrappers: set) -> None:
    """Close the Django connections the tracker's threads opened, once those threads are done."""
    for wrapper in wrappers:
        wrapper.inc_thread_sharing()
        try:
            wrapper.close()
        finally:
            wrapper.dec_thread_sharing()
