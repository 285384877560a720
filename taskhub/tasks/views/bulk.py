"""Cancel many tasks: the confirmation (a dry run: count, sample, skipped and why) and the cancel itself.

GET takes the task list's filters (the same names and checks, queries.TaskFilterForm) or ticked rows (`ids`); the
confirmation carries them, with the time of the dry run (`before`) and its count, to the POST, which makes one
service call (bulk.request_cancels). Bad input is reported and changes nothing.
"""

import datetime
import uuid

from django.contrib import messages
from django.http import QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext, ngettext
from django.views.decorators.http import require_http_methods

from taskhub.accounts.permissions import operator_required
from taskhub.tasks import bulk
from taskhub.tasks.queries import (
    STATUS_CHOICES,
    TAB_STATUSES,
    TaskFilterForm,
    filter_errors,
    filtered_tasks,
    tasks_visible_to,
)
from taskhub.tasks.views.listing import FILTER_NAMES

TEMPLATE = "tasks/bulk_cancel.html"
MAX_IDS = 500  # ticked rows: a page of the list holds 50


def _filters(params: QueryDict, errors: dict[str, str]) -> dict[str, str]:
    """The list's filters in force (valid ones), as in its URL."""
    names = (*FILTER_NAMES, "status")
    return {name: params.get(name, "") for name in names if params.get(name, "") and name not in errors}


def _selection(request, params: QueryDict):
    """(tasks chosen, the filter form, errors, the filters, the ticked ids)."""
    form = TaskFilterForm(params or None, user=request.user)
    tasks, status = filtered_tasks(form, request.user)
    errors = filter_errors(form)
    raw_ids = [value for value in params.getlist("ids") if value.strip()]
    ids: list[uuid.UUID] = []
    for value in raw_ids[: MAX_IDS + 1]:
        try:
            ids.append(uuid.UUID(value.strip()))
        except ValueError:
            errors["ids"] = f"“{value[:60]}” is not a task id; tick rows in the task list."
            break
    if len(raw_ids) > MAX_IDS:
        errors["ids"] = f"At most {MAX_IDS} ticked tasks at once; choose them by a filter instead."
    if ids:
        tasks = tasks_visible_to(request.user).filter(pk__in=ids)
    elif status:
        tasks = tasks.filter(status__in=TAB_STATUSES[status])
    return tasks, form, errors, _filters(params, errors), ids


def _described(filters: dict[str, str], form: TaskFilterForm, ids: list[uuid.UUID]) -> list[tuple[str, str]]:
    """The choice in words, for the page: (label, value)."""
    if ids:
        return [
            (
                gettext("Ticked in the list"),
                ngettext("%(count)d task", "%(count)d tasks", len(ids)) % {"count": len(ids)},
            )
        ]
    words = []
    for name, value in filters.items():
        if name == "status":
            words.append((gettext("Status"), str(dict(STATUS_CHOICES).get(value, value))))
        elif name in form.fields:
            field = form.fields[name]
            shown = value
            if name == "server" and form.cleaned_data.get("server"):
                shown = form.cleaned_data["server"].name
            elif hasattr(field, "choices") and name != "server":
                shown = dict(field.choices).get(value, value)
            words.append((str(field.label or name.replace("_", " ").capitalize()), str(shown)))
    return words or [(gettext("Filter"), gettext("none: every task you can see"))]


def _before(value: str) -> datetime.datetime | None:
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if timezone.is_aware(moment) else None


@operator_required
@require_http_methods(["GET", "POST"])
def cancel_many(request):
    params = request.POST if request.method == "POST" else request.GET
    tasks, form, errors, filters, ids = _selection(request, params)
    list_href = reverse("tasks:list") + ("?" + urlencode(filters) if filters else "")
    context = {
        "filters": filters,
        "ids": ids,
        "described": _described(filters, form, ids),
        "list_href": list_href,
        "errors": errors,
        "max_tasks": bulk.max_tasks(),
    }
    if request.method == "POST":
        before = _before(params.get("before", ""))
        if before is None:
            errors["before"] = "The confirmation is missing the time of its count; count again below."
        if errors:
            return _page(request, context, tasks, status=400)
        expected = params.get("expected", "")
        try:
            done = bulk.request_cancels(
                tasks=tasks,
                user=request.user,
                before=before,
                query={"ids": [str(pk) for pk in ids]} if ids else filters,
                expected=int(expected) if expected.isdigit() else None,
            )
        except bulk.BulkRefused as refusal:
            context["refusal"] = str(refusal)
            return _page(request, context, tasks, status=409)
        requested = ngettext("Cancel requested for %(count)s task", "Cancel requested for %(count)s tasks", done.count)
        said = {"requested": requested % {"count": done.count}}
        if done.skipped:  # the reasons' words stay English in the audit row, and are the reader's here
            said["skipped"] = "; ".join(f"{n} {gettext(reason)}" for reason, n in done.skipped)
            sentences = [gettext("%(requested)s (skipped: %(skipped)s).") % said]
        else:
            sentences = [gettext("%(requested)s.") % said]
        if done.more:
            sentences.append(
                gettext("%(more)s more matched beyond the %(limit)s at a time: cancel again for them.")
                % {"more": done.more, "limit": bulk.max_tasks()}
            )
        sentences.append(
            gettext("taskhub tells the servers a few at a time; each task shows when its server stops it.")
        )
        messages.success(request, " ".join(sentences))
        return redirect(list_href)
    return _page(request, context, tasks)


def _page(request, context, tasks, status: int = 200):
    if not context["errors"]:
        now = timezone.now()
        context["preview"] = bulk.preview(tasks=tasks, user=request.user, before=now)
        context["before"] = now.isoformat()
    return render(request, TEMPLATE, context, status=status)
