"""The navigation counts: running tasks (for those who see all tasks) and the requests waiting for the user.

Both on every page: read from the counts triggers keep per server (observability.counts), not counted over the
tasks and requests (but the few servers where the user may answer only some requests: tasks/waiting.py)."""

from django.template.loader import render_to_string

from taskhub.live.access import LiveAccess, access_in_force
from taskhub.observability import counts
from taskhub.tasks.models import TaskStatus
from taskhub.tasks.waiting import waiting_count

NAV_COUNTS_TEMPLATE = "live/nav_counts.html"
RUNNING_STATUSES = (TaskStatus.LAUNCHING, TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED)


def nav_counts(
    user, access: LiveAccess | None = None, *, running: int | None = None, waiting: int | None = None
) -> dict[str, int | None]:
    """None where the count is not this user's business (shown as a dash). `running`: the running tasks among all
    tasks when the caller has counted them already (the unfiltered task list has); `waiting`: the requests waiting for
    the user, likewise (Home has)."""
    access = access if access is not None else access_in_force(user)
    if not access.sees_all_tasks:
        running = None
    elif running is None:
        per_status = counts.tasks_per_status()
        running = sum(per_status.get(status, 0) for status in RUNNING_STATUSES)
    open_requests = None
    if access.approvable_server_ids:
        # "Waiting for me", as Home, the inbox and the API count it (taskhub/tasks/waiting.py).
        open_requests = (
            waiting if waiting is not None else waiting_count(user, approvable_server_ids=access.approvable_server_ids)
        )
    return {"running": running, "open_requests": open_requests}


def nav_counts_fragment(user) -> str:
    return render_to_string(f"{NAV_COUNTS_TEMPLATE}#nav-counts", {"nav_counts": nav_counts(user), "oob": True})
