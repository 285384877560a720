"""`manage.py launch SERVER TOOL --as USER [--arguments JSON] [--wait SECONDS]`: a tool call from a script.

The user must be an operator; services.launch checks the rest as for the Launch page (the tool in the
server's catalogue, the arguments valid for its input schema) and writes the same audit row; a worker
sends the call.
"""

import json
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from taskhub.accounts import permissions
from taskhub.servers.models import Server
from taskhub.tasks import services
from taskhub.tasks.errors import TaskError, UnknownTool
from taskhub.tasks.models import Task


class Command(BaseCommand):
    help = "Launch a tool call as USER; prints the task id (and, with --wait, its outcome as JSON)."

    def add_arguments(self, parser):
        parser.add_argument("server", help="server name")
        parser.add_argument("tool")
        parser.add_argument("--as", dest="username", required=True, help="the operator the call is launched as")
        parser.add_argument("--arguments", default="{}", help="the tool's arguments as a JSON object")
        parser.add_argument("--wait", type=float, default=0, metavar="SECONDS", help="wait for the task to end")

    def handle(self, *args, server, tool, username, arguments, wait, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None or not permissions.is_operator(user):
            raise CommandError(f"{username!r} is not an active operator.")
        target = Server.named(server)
        if target is None:
            raise CommandError(f"No server named {server!r}.")
        try:
            values = json.loads(arguments)
        except ValueError as error:
            raise CommandError(f"--arguments is not JSON: {error}") from error
        try:
            task = services.launch(server=target, tool=tool, arguments=values, user=user)
        except UnknownTool as error:
            raise CommandError(f"{error} (run `manage.py server discover {server}`?)") from error
        except TaskError as error:
            raise CommandError(str(error)) from error
        self.stdout.write(str(task.pk))
        if wait > 0:
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                task = Task.objects.get(pk=task.pk)
                if task.is_terminal:
                    break
                time.sleep(0.5)
            outcome = {"status": task.status, "result": task.result, "error": task.error}
            self.stdout.write(json.dumps(outcome, indent=2))
            if not task.is_terminal:
                raise CommandError(f"The task is still {task.status} after {wait:g} s.")
