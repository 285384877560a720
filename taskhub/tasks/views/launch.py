"""Launch (operators): choose a server's tool, fill the form generated from its inputSchema, launch.

Only tools in the server's stored catalogue can be launched; the arguments are checked against the
tool's inputSchema here (jsonschema) before services.launch writes the task; then the new task's page.
"""

import json

from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render

from taskhub.accounts.permissions import is_admin, may_launch, operator_required
from taskhub.servers.catalogue import find_tool, health_of, tools_of
from taskhub.servers.models import Server
from taskhub.tasks import input_forms, services
from taskhub.tasks.errors import ArgumentsRejected, TaskError

MAX_JSON_CHARS = 1_000_000


@operator_required
def choose_tool(request):
    servers = [
        {"server": server, "tools": tools_of(server), "health": health_of(server)}
        for server in Server.objects.filter(enabled=True).prefetch_related("approver_groups")
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


@operator_required
def launch_tool(request, server_id, tool):
    server = get_object_or_404(Server, pk=server_id)
    if not may_launch(request.user, server):
        raise PermissionDenied(f"The server {server.name} is disabled: tools cannot be launched on it.")
    entry = find_tool(server, tool)
    if entry is None:
        raise Http404("This server's catalogue has no such tool; discover the server again if it is new.")
    form = input_forms.build_form(entry.input_schema)
    mode = "json" if not form.renderable else request.GET.get("mode", "form")
    json_text = _as_json(form.defaults)
    json_error = ""
    form_error = ""
    status = 200

    if request.method == "POST":
        mode = request.POST.get("mode", "form") if form.renderable else "json"
        switch = request.POST.get("switch")
        if mode == "json":
            json_text = request.POST.get("arguments_json", "")
            arguments, json_error = _parse_json(json_text)
            converted = not json_error
        else:
            arguments, converted = form.arguments_from(request.POST)

        if switch == "json" and mode == "form" and form.renderable:
            # Carry what was entered over to the JSON box; nothing is checked yet.
            for form_field in form.fields:
                form_field.error = ""
            json_text, mode = _as_json(arguments), "json"
        elif switch == "form" and mode == "json" and form.renderable and not json_error:
            form.bind(arguments)
            mode = "form"
        elif mode == "json" and json_error:
            status = 400
        else:
            # Fields that could not be converted keep their own error; the schema speaks for the rest.
            errors = input_forms.validate_arguments(entry.input_schema, arguments)
            if converted and not errors:
                try:
                    task = services.launch(server=server, tool=entry.name, arguments=arguments, user=request.user)
                except ArgumentsRejected as rejected:
                    errors = rejected.field_errors  # shown like the schema's, next to their fields
                except TaskError as error:
                    form_error = str(error)
                else:
                    return redirect("tasks:detail", task_id=task.id)
            if form_error:
                pass
            elif mode == "json":
                json_error = " ".join(f"{name}: {message}" if name else message for name, message in errors.items())
            else:
                form_error = form.set_errors(errors)
            status = 400
    elif mode == "json":
        json_text = _as_json(form.defaults)

    has_field_errors = any(form_field.error for form_field in form.fields)
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
        },
        status=status,
    )
