"""Tasks that ask for input, made through the services as a server's answers would make them."""

from catalogue_fixtures import with_tools

from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest


def snapshot(task, status, requests=None) -> TaskSnapshot:
    data = {"taskId": f"r-{task.id}", "status": status, "ttlMs": None}
    if requests is not None:
        data["inputRequests"] = requests
    return TaskSnapshot.model_validate(data)


def task_asking(server, requests, tool="deploy"):
    """A task launched through services that the server then follows with an input_required snapshot."""
    task = services.launch(server=with_tools(server, tool), tool=tool, arguments={}, user=None)
    task = services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(task, "working")))
    services.apply_snapshot(task=task, snapshot=snapshot(task, "input_required", requests))
    return task


def request_of(task, key) -> InputRequest:
    return InputRequest.objects.select_related("task__server").get(task=task, key=key)
