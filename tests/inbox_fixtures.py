"""Tasks that ask for input, made through the services as a server's answers would make them."""

from catalogue_fixtures import with_tools
from helpers import snapshot

from taskhub.mcp.client import TaskCreated
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest


def remote_id(task) -> str:
    return f"r-{task.id}"


def task_asking(server, requests, tool="deploy"):
    """A task launched through services that the server then follows with an input_required snapshot."""
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments={}, user=None)
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task_id=remote_id(task))))
    services.apply_snapshot(
        task=task, snapshot=snapshot("input_required", task_id=remote_id(task), inputRequests=requests)
    )
    return task


def request_of(task, key) -> InputRequest:
    return InputRequest.objects.select_related("task__server").get(task=task, key=key)
