"""The task list, the task detail and Cancel. Thin: permissions decide who sees what, services change things.

A task the user may not see answers 404, as if it did not exist (its id says nothing to a stranger).
"""

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from taskhub.accounts import permissions
from taskhub.live.nav import RUNNING_STATUSES, nav_counts
from taskhub.tasks import services
from taskhub.tasks.errors import InvalidTransition
from taskhub.tasks.models import Task
from taskhub.tasks.presenters import detail_context
from taskhub.tasks.queries import TAB_STATUSES, TABS, TaskFilterForm, filtered_tasks

PAGE_SIZE = 50
LIST_TEMPLATE = "tasks/list.html"
DETAIL_TEMPLATE = "tasks/detail.html"
# What a row of the list shows (the task-row partial): the big JSON columns (arguments, result, error) stay behind.
ROW_FIELDS = (
    "status",
    "status_message",
    "tool",
    "cancel_requested_at",
    "created_at",
    "updated_at",
    "server__name",
    "launched_by__username",
)


def _require_task_viewer(request):
    """Anonymous → sign in; a signed-in user who may see no task at all → 403 saying who may."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    roles = permissions.roles_of(request.user)
    if not (roles.operator or roles.approver):
        raise PermissionDenied("The task list is for operators, admins and approvers.")
    return None


def _query(params: dict, **changes) -> str:
    merged = {key: value for key, value in {**params, **changes}.items() if value not in ("", None)}
    return "?" + urlencode(merged) if merged else ""


@require_GET
def task_list(request):
    refusal = _require_task_viewer(request)
    if refusal:
        return refusal
    form = TaskFilterForm(request.GET or None, user=request.user)
    tasks, status = filtered_tasks(form, request.user)

    # COUNT(*), not COUNT(id): under a server or launcher filter the (…, created_at) INCLUDE (status) index answers
    # alone (an index-only scan); id is not in it.
    counts = dict(tasks.order_by().values_list("status").annotate(n=Count("*")))
    filters = {key: request.GET.get(key, "") for key in ("server", "tool", "launched_by", "q")}
    tabs = [
        {
            "value": value,
            "label": label,
            "count": sum(counts.values()) if statuses is None else sum(counts.get(s, 0) for s in statuses),
            "href": _query(filters, status=value),
            "current": value == status,
        }
        for value, label, statuses in TABS
    ]
    if status:
        tasks = tasks.filter(status__in=TAB_STATUSES[status])
    tasks = tasks.select_related("server", "launched_by").only(*ROW_FIELDS).order_by("-created_at")
    paginator = Paginator(tasks, PAGE_SIZE, allow_empty_first_page=True)
    # The current tab's count is the paginator's: no second COUNT over the same tasks.
    paginator.count = next(tab["count"] for tab in tabs if tab["value"] == status)
    if not any(filters.values()) and permissions.sees_all_tasks(request.user):
        # The counts cover every task, so they hold the nav's running count too: no third scan.
        running = sum(counts.get(s, 0) for s in RUNNING_STATUSES)
        extra_context = {"nav_counts": SimpleLazyObject(lambda: nav_counts(request.user, running=running))}
    else:
        extra_context = {}
    page = paginator.get_page(request.GET.get("page"))
    here = {**filters, "status": status}
    context = {
        "form": form,
        "tabs": tabs,
        "page": page,
        "tasks": page.object_list,
        "status": status,
        "filtered": any(filters.values()),
        "previous_href": _query(here, page=page.previous_page_number()) if page.has_previous() else "",
        "next_href": _query(here, page=page.next_page_number()) if page.has_next() else "",
        "clear_href": _query({}, status=status),
        **extra_context,
    }
    if request.htmx and not request.htmx.boosted:
        return render(request, f"{LIST_TEMPLATE}#task-results", context)
    return render(request, LIST_TEMPLATE, context)


# --- detail ------------------------------------------------------------------------------------------


def visible_task_or_404(user, task_id) -> Task:
    task = Task.objects.select_related("server", "launched_by", "cancel_requested_by").filter(pk=task_id).first()
    if task is None or not permissions.may_see_task(user, task):
        raise Http404("No such task.")
    return task


@require_GET
def task_detail(request, task_id):
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    task = visible_task_or_404(request.user, task_id)
    context = detail_context(task, request.user)
    if request.GET.get("fragment") == "requests":
        return render(request, f"{DETAIL_TEMPLATE}#input-requests", context)
    if request.htmx and request.GET.get("fragment") == "live":
        # The page re-syncs after a reconnect: every section, out of band.
        return render(request, f"{DETAIL_TEMPLATE}#live-sections", {**context, "oob": True})
    return render(request, DETAIL_TEMPLATE, context)


@require_POST
def task_cancel(request, task_id):
    if not request.user.is_authenticated:
        return redirect_to_login(reverse("tasks:detail", args=[task_id]))
    task = visible_task_or_404(request.user, task_id)
    if not permissions.may_cancel(request.user, task):
        raise PermissionDenied("Only operators may cancel tasks.")
    cancel_error = ""
    try:
        task = services.request_cancel(task=task, user=request.user)
    except InvalidTransition as error:  # TaskAlreadyFinished is one
        cancel_error = str(error)
    if request.htmx:
        task = visible_task_or_404(request.user, task_id)
        context = {**detail_context(task, request.user), "cancel_error": cancel_error}
        return render(request, f"{DETAIL_TEMPLATE}#header", context)
    if cancel_error:
        messages.error(request, f"The task was not cancelled: {cancel_error}")
    else:
        messages.success(request, "Cancel requested: the server is being asked to stop the task.")
    return redirect("tasks:detail", task_id=task_id)
