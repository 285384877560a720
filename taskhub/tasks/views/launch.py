"""Launch (operators): choose a server's tool, fill the form generated from its inputSchema, launch.

services.launch decides what may be launched (a tool of the server's catalogue, arguments that fit its
inputSchema); this view turns its LaunchRefused into errors on the fields, then shows the new task's page.
"""

import json
import uuid

from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _

from taskhub.accounts.permissions import is_admin, may_launch, may_see_task, operator_required
from taskhub.mcp.schema_fields import messages_of
from taskhub.servers.catalogue import find_tool, health_of, tools_of
from taskhub.servers.models import Server
from taskhub.tasks import services
from taskhub.tasks.errors import LaunchRefused, TaskError
from taskhub.tasks.models import Task
from taskhub.tasks.schema_forms import launch_form

MAX_JSON_CHARS = 1_000_000


@operator_required
def choose_tool(request):
    servers = [
        {"server": server, "tools": tools_of(server), "health": health_of(server)}
        for server in Server.objects.filter(enabled=True)
    ]
    return render(
        request,
        "tasks/launch.html",
        {"servers": servers, "may_discover": is_admin(request.user)},
    )


def _as_json(value) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return "{}"


def _parse_json(text: str):
    """(arguments, error) from the JSON box."""
    if len(text) > MAX_JSON_CHARS:
        return None, f"The JSON is longer than {MAX_JSON_CHARS:,} characters."
    try:
        value = json.loads(text or "{}")
    except ValueError as error:
        return None, f"This is not valid JSON: {error}."
    if not isinstance(value, dict):
        return None, 'The arguments must be a JSON object, like {"name": "value"}.'
    return value, ""


def _run_again(request, server: Server, tool: str) -> Task | None:
    """The task of `?again=<task id>` whose launch this form repeats: one the user may see, of this server and tool.
    Anything else (a bad id, a task of another tool) is ignored: the form starts from the schema's defaults."""
    try:
        task_id = uuid.UUID(request.GET.get("again", ""))
    except ValueError:
        return None
    task = Task.objects.filter(pk=task_id, server=server, tool=tool).first()
    return task if task is not None and may_see_task(request.user, task) else None


@operator_required
def launch_tool(request, server_id, tool):
    server = get_object_or_404(Server, pk=server_id)
    if not may_launch(request.user, server):
        raise PermissionDenied(
            _("The server %(server)s is disabled: tools cannot be launched on it.") % {"server": server.name}
        )
    entry = find_tool(server, tool)
    if entry is None:
        raise Http404("This server's catalogue has no such tool; discover the server again if it is new.")
    form = launch_form(entry.input_schema)
    mode = "json" if not form.renderable else request.GET.get("mode", "form")
    json_text = _as_json(form.defaults)
    again = _run_again(request, server, entry.name) if request.method == "GET" else None
    json_error = ""
    form_error = ""
    status = 200

    if request.method == "POST":
        mode = request.POST.get("mode", "form") if form.renderable else "json"
        switch = request.POST.get("switch")
        problems: dict[str, str] = {}
        if mode == "json":
            json_text = request.POST.get("arguments_json", "")
            arguments, json_error = _parse_json(json_text)
        else:
            arguments, problems = form.read(request.POST)

        if switch == "json" and mode == "form" and form.renderable:
            # Carry what was entered over to the JSON box; nothing is checked yet.
            form.clear_errors()
            json_text, mode = _as_json(arguments), "json"
        elif switch == "form" and mode == "json" and form.renderable and not json_error:
            form.show(arguments)
            mode = "form"
        elif mode == "json" and json_error:
            status = 400
        else:
            try:
                if problems:
                    # Fields that could not be read keep their own error; the service speaks for the rest.
                    services.check_launch(server=server, tool=entry.name, arguments=arguments)
                else:
                    task = services.launch(server=server, tool=entry.name, arguments=arguments, user=request.user)
                    return redirect("tasks:detail", task_id=task.id)
            except LaunchRefused as refused:
                if mode == "json":
                    json_error = messages_of(refused.field_errors) or str(refused)
                else:
                    form_error = form.set_errors(refused.field_errors) or ("" if refused.field_errors else str(refused))
            except TaskError as error:
                form_error = str(error)
            status = 400
    elif again is not None:
        # The form shows the earlier task's arguments; JSON where the form cannot hold them all.
        arguments = again.arguments if isinstance(again.arguments, dict) else {}
        json_text = _as_json(arguments)
        if form.renderable and set(arguments) <= {field.name for field in form.answerable_fields}:
            form.show(arguments)
        else:
            mode = "json"
    elif mode == "json":
        json_text = _as_json(form.defaults)

    has_field_errors = form.has_errors
    return render(
        request,
        "tasks/launch_tool.html",
        {
            "server": server,
            "tool": entry,
            "form": form,
            "mode": mode if mode in ("form", "json") else "form",
            "json_text": json_text,
            "json_error": json_error,
            "form_error": form_error,
            "has_field_errors": has_field_errors,
            "again": again,
        },
        status=status,
    )
