"""Following tasks on a HostileServer (tests/hostile_server.py): registering it, tasks the tracker follows,
a healthy control task, the protocol errors on a task's timeline."""

from __future__ import annotations

import re
import uuid

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import Task
from tests.catalogue_fixtures import with_tools
from tests.helpers import wait_until
from tests.hostile_server import HostileServer, Result, working


def register(server: HostileServer) -> Server:
    return create_server(
        name=f"hostile {server.port} {uuid.uuid4().hex[:6]}", transport="http", url=server.url, user=None
    )


def new_remote_id(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:10]}"


def followed(server: Server, remote_task_id: str, **fields) -> Task:
    """A task whose launch answered with a working task handle, so the tracker follows it."""
    task = services.launch(server=with_tools(server, "work"), tool="work", arguments={}, user=None)
    wire = {"taskId": remote_task_id, "status": "working", **fields}
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=TaskSnapshot.model_validate(wire)))


def step_of(task: Task) -> int:
    message = Task.objects.get(pk=task.pk).status_message
    match = re.fullmatch(r"step (\d+)", message)
    return int(match.group(1)) if match else 0


class Control:
    """A healthy task whose status message says how often it was polled: "step n"."""

    def __init__(self, hostile_server: HostileServer, server: Server) -> None:
        remote = new_remote_id("control")
        hostile_server.script(remote, lambda n: Result(working(remote, statusMessage=f"step {n}")))
        self.task = followed(server, remote)

    def assert_progressing(self, steps: int = 3) -> None:
        start = step_of(self.task)
        wait_until(lambda: step_of(self.task) >= start + steps, timeout=15, what="the control task to progress")


def protocol_errors(task: Task) -> list[dict]:
    events = AuditEvent.objects.filter(task_id=task.pk, action="task.protocol_error").order_by("id")
    return list(events.values_list("data", flat=True))
