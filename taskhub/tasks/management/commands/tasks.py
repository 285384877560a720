"""`manage.py tasks [filters] [--json]`: the task list from a script, with the page's filters."""

import json

from django.core.management.base import BaseCommand, CommandError

from taskhub.servers.models import Server
from taskhub.tasks.models import Task
from taskhub.tasks.queries import TAB_STATUSES, search


class Command(BaseCommand):
    help = "List tasks, newest first (every task: this runs with the database's rights, not a user's)."

    def add_arguments(self, parser):
        parser.add_argument("--status", choices=[value for value in TAB_STATUSES if value])
        parser.add_argument("--server")
        parser.add_argument("--tool")
        parser.add_argument("--launched-by")
        parser.add_argument(
            "--q", help="search as the page does: task id (ours or the server's), tool, arguments, result, message"
        )
        parser.add_argument("--limit", type=int, default=50)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        tasks = Task.objects.select_related("server", "launched_by").order_by("-created_at")
        if options["status"]:
            tasks = tasks.filter(status__in=TAB_STATUSES[options["status"]])
        if options["server"]:
            if not Server.objects.filter(name=options["server"]).exists():
                raise CommandError(f"No server named {options['server']!r}.")
            tasks = tasks.filter(server__name=options["server"])
        if options["tool"]:
            tasks = tasks.filter(tool=options["tool"])
        if options["launched_by"]:
            tasks = tasks.filter(launched_by__username=options["launched_by"])
        if options["q"]:
            tasks = search(tasks, options["q"].strip())
        rows = [
            {
                "id": str(task.pk),
                "status": task.status,
                "tool": task.tool,
                "server": task.server.name,
                "launched_by": task.launched_by.get_username() if task.launched_by else None,
                "launched_via": task.launched_via_label or None,  # the API token (agent): its name and prefix
                "status_message": task.status_message,
                "created_at": task.created_at.isoformat(),
            }
            for task in tasks[: max(1, options["limit"])]
        ]
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        for row in rows:
            message = row["status_message"].replace("\n", " ")[:60]
            self.stdout.write(f"{row['id']}  {row['status']:<15} {row['tool']} @ {row['server']}  {message}")
