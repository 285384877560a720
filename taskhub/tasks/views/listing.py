"""The task list, the task detail and Cancel. Thin: permissions decide who sees what, services change things.

A task the user may not see answers 404, as if it did not exist (its id says nothing to a stranger).
"""

import functools

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from taskhub.accounts import permissions
from taskhub.live.nav import RUNNING_STATUSES, nav_counts
from taskhub.tasks import services
from taskhub.tasks.errors import InvalidTransition
from taskhub.tasks.list_rows import rows_by_ids
from taskhub.tasks.models import Task
from taskhub.tasks.outcomes import settle_outcomes
from taskhub.tasks.presenters import detail_context
from taskhub.tasks.queries import (
    COUNT_CAP,
    NEEDS,
    STATUS_CHOICES,
    TAB_STATUSES,
    TABS,
    TaskFilterForm,
    capped_count,
    filter_errors,
    filtered_tasks,
    status_counts,
)

PAGE_SIZE = 50
TAB_VALUES = frozenset(value for value, _, _ in TABS)
LIST_TEMPLATE = "tasks/list.html"
DETAIL_TEMPLATE = "tasks/detail.html"
# The filters a page of the list keeps in its links (tabs, pager, clear), besides the status.
FILTER_NAMES = (
    "server",
    "tool",
    "launched_by",
    "agent",
    "mine",
    "q",
    "older",
    "since",
    "until",
    "ended",
    "outcome",
    "needs",
)


def _require_task_viewer(request):
    """Anonymous → sign in; a signed-in user who may see no task at all → 403 saying who may."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    roles = permissions.roles_of(request.user)
    if not (roles.operator or roles.approver):
        raise PermissionDenied(_("The task list is for operators, admins and approvers."))
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
    errors = filter_errors(form)

    filters = {key: request.GET.get(key, "") for key in FILTER_NAMES if key not in errors}
    counts, capped = _status_counts(request.user, form, filters, tasks)
    over_cap = f"{COUNT_CAP:,}+"

    def tab_count(statuses) -> int | str:
        if capped:  # only "All" is known: more than the cap
            return over_cap if statuses is None else ""
        return sum(counts.values()) if statuses is None else sum(counts.get(s, 0) for s in statuses)

    tabs = [
        {
            "value": value,
            "label": label,
            "count": tab_count(statuses),
            "href": _query(filters, status=value),
            "current": value == status,
        }
        for value, label, statuses in TABS
    ]
    if status:
        tasks = tasks.filter(status__in=TAB_STATUSES[status])
    if capped:
        # The tab asked for, on its own: the pager's count, and the tab's when it is below the cap.
        listed = capped_count(tasks) if status else COUNT_CAP + 1
        listed_capped = listed > COUNT_CAP
        for tab in tabs:
            if tab["current"] and status:
                tab["count"] = over_cap if listed_capped else listed
    else:
        listed = sum(counts.get(s, 0) for s in TAB_STATUSES[status]) if status else sum(counts.values())
        listed_capped = False
    # The rows' ids: the page's rows are read by them (list_rows), in one statement prepared once.
    paginator = Paginator(
        tasks.order_by("-created_at").values_list("pk", flat=True), PAGE_SIZE, allow_empty_first_page=True
    )
    # The count is the tabs': no second COUNT over the same tasks. Past the cap the pages stop at the cap's.
    paginator.count = listed
    if not any(filters.values()) and permissions.sees_all_tasks(request.user):
        # The counts cover every task, so they hold the nav's running count too.
        running = sum(counts.get(s, 0) for s in RUNNING_STATUSES)
        extra_context = {"nav_counts": SimpleLazyObject(lambda: nav_counts(request.user, running=running))}
    else:
        extra_context = {}
    page = paginator.get_page(request.GET.get("page"))
    page.object_list = settle_outcomes(rows_by_ids(list(page.object_list)))
    here = {**filters, "status": status}
    context = {
        "form": form,
        "tabs": tabs,
        "page": page,
        "tasks": page.object_list,
        "status": status,
        "filtered": any(filters.values()),
        "counts_capped": capped,
        "listed_capped": listed_capped,
        "count_cap": f"{COUNT_CAP:,}",
        "errors": errors,
        # A status that is no tab (?status=running, launching…, from the home page) is named above the tabs.
        "status_chip": "" if status in TAB_VALUES else dict(STATUS_CHOICES).get(status, ""),
        "previous_href": _query(here, page=page.previous_page_number()) if page.has_previous() else "",
        "next_href": _query(here, page=page.next_page_number()) if page.has_next() else "",
        "clear_href": _query({}, status=status),
        "clear_status_href": _query(filters),
        "needs_words": dict(NEEDS).get(filters.get("needs", ""), ""),
        # Operators tick rows or take the filter's matches to cancel many (views/bulk.py).
        "selectable": permissions.is_operator(request.user),
        "bulk_query": _query(here),
        "bulk_filters": {key: value for key, value in here.items() if value},
        **extra_context,
    }
    # Called by the template where it draws the bar: the live re-fetch of the results draws none, and reads nothing.
    # Given the values it names, not the context: a context that held it would be a reference cycle, its rows and
    # form freed only by the garbage collector (a young collection every 50 list pages, 10-25 ms each).
    context["filter_bar"] = functools.partial(
        _filter_bar_shown, form, errors, tuple(context[name] for name in FILTER_BAR_CONTEXT)
    )
    if request.htmx and not request.htmx.boosted:
        return render(request, f"{LIST_TEMPLATE}#task-results", context)
    return render(request, LIST_TEMPLATE, context)


# What the filter bar shows besides the form (templates/tasks/list.html, inside {% kept filter_bar %}).
FILTER_BAR_CONTEXT = ("status", "filtered", "clear_href", "selectable", "bulk_query")
# The bar's selects whose choices are read from the database (the servers the user sees, their API tokens).
READ_CHOICES = ("server", "agent")


def _filter_bar_shown(form: TaskFilterForm, errors: dict[str, str], shown: tuple) -> tuple:
    """All the filter bar shows, as one hashable value, to keep it rendered while that reads the same: each field's
    value as its widget draws it and whether it has errors, the choices of the selects that are read (read here, once:
    the widgets draw what was read), the filter errors and the page's values the bar names. Its eleven widgets,
    drawn through Django's form templates option by option, were 6 % of a list page's instructions (callgrind, the
    bench's million tasks: 55.7 → 52.8 million a request; about 1 ms of its 11-12 ms of CPU)."""
    fields = [(name, _as_key(form[name].value()), bool(form[name].errors)) for name in form.fields]
    for name in READ_CHOICES:
        field = form.fields[name]
        field.choices = choices = list(field.choices)
        fields.append((name, tuple((str(value), str(label)) for value, label in choices)))
    return tuple(fields), tuple(errors.items()), shown


def _as_key(value):
    return value if isinstance(value, str | bool | int | type(None)) else str(value)


def _status_counts(user, form, filters: dict, tasks) -> tuple[dict[str, int], bool]:
    """The tabs' counts: those the database keeps where the list is every visible task, or those of one server;
    under any other filter a capped count (queries.status_counts)."""
    if any(value for key, value in filters.items() if key != "server"):
        return status_counts(tasks)
    visible = None if permissions.sees_all_tasks(user) else set(permissions.approvable_servers(user))
    server = form.cleaned_data.get("server") if form.is_bound else None
    if server is not None:
        visible = {server.pk} & visible if visible is not None else {server.pk}
    return status_counts(tasks, kept=True, kept_server_ids=visible)


# --- detail ------------------------------------------------------------------------------------------


def visible_task_or_404(user, task_id) -> Task:
    # With its poll: the page's facts show the next one.
    task = (
        Task.objects.select_related("server", "launched_by", "cancel_requested_by", "poll").filter(pk=task_id).first()
    )
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
        raise PermissionDenied(_("Only operators may cancel tasks."))
    cancel_error = ""
    try:
        task = services.request_cancel(task=task, user=request.user)
    except InvalidTransition as error:  # TaskAlreadyFinished is one
        cancel_error = str(error)
    if request.htmx:
        task = visible_task_or_404(request.user, task_id)
        context = {**detail_context(task, request.user), "cancel_error": cancel_error}
        return render(request, f"{DETAIL_TEMPLATE}#cancel-answer", context)
    if cancel_error:
        messages.error(request, _("The task was not cancelled: %(error)s") % {"error": cancel_error})
    else:
        messages.success(request, _("Cancel requested: the server is being asked to stop the task."))
    return redirect("tasks:detail", task_id=task_id)


CONFIRM_TEMPLATE = "tasks/cancel_confirm.html"


@require_GET
def task_cancel_confirm(request, task_id):
    """The confirm step before a single cancel: a page of its own without JS, a box under the header with htmx."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    task = visible_task_or_404(request.user, task_id)
    if not permissions.may_cancel(request.user, task):
        raise PermissionDenied(_("Only operators may cancel tasks."))
    context = detail_context(task, request.user)
    if request.htmx:
        return render(request, f"{CONFIRM_TEMPLATE}#confirm", context)
    return render(request, CONFIRM_TEMPLATE, context)
