"""Which tasks a person asks for: the filters of the task list page, shared with the JSON API."""

from django import forms
from django.db.models import QuerySet

from taskhub.accounts import permissions
from taskhub.servers.models import Server
from taskhub.tasks.models import Task, TaskStatus

OTHER = "other"
OTHER_STATUSES = (TaskStatus.LAUNCHING, TaskStatus.LAUNCH_UNKNOWN, TaskStatus.EXPIRED)
# (value of ?status=, label, statuses it covers); "" is All.
TABS = (
    ("", "All", None),
    (TaskStatus.WORKING.value, "Working", (TaskStatus.WORKING,)),
    (TaskStatus.INPUT_REQUIRED.value, "Needs input", (TaskStatus.INPUT_REQUIRED,)),
    (TaskStatus.COMPLETED.value, "Completed", (TaskStatus.COMPLETED,)),
    (TaskStatus.FAILED.value, "Failed", (TaskStatus.FAILED,)),
    (TaskStatus.CANCELLED.value, "Cancelled", (TaskStatus.CANCELLED,)),
    (OTHER, "Other", OTHER_STATUSES),
)
TAB_STATUSES = {value: statuses for value, _, statuses in TABS}


def tasks_visible_to(user) -> QuerySet[Task]:
    """The tasks this user may see: all for operators and admins, those of the servers they approve for an
    approver, none for anyone else. The task list filters by it; the detail page and the live socket agree."""
    if permissions.sees_all_tasks(user):
        return Task.objects.all()
    if not permissions.is_approver(user):
        return Task.objects.none()
    return Task.objects.filter(server__in=permissions.servers_user_may_approve(user))


class TaskFilterForm(forms.Form):
    """The filter bar; every field optional. A value that does not fit is reported and left out of the filter."""

    status = forms.ChoiceField(required=False, choices=[(value, label) for value, label, _ in TABS])
    server = forms.ModelChoiceField(required=False, queryset=Server.objects.none(), empty_label="any server")
    tool = forms.CharField(required=False, max_length=200)
    launched_by = forms.CharField(required=False, max_length=150, label="Launched by")
    q = forms.CharField(required=False, max_length=200, label="Status message contains")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        visible_servers = Server.objects.filter(pk__in=tasks_visible_to(user).values("server_id"))
        self.fields["server"].queryset = visible_servers.order_by("name")
        for name in ("tool", "launched_by", "q"):
            self.fields[name].widget.attrs["autocomplete"] = "off"


def filtered_tasks(form: TaskFilterForm, user):
    """The tasks `user` may see, narrowed by the form's valid filters; and the status tab asked for."""
    tasks = tasks_visible_to(user)
    # A bound form's cleaned_data holds the fields that are fine; the others are reported and left out.
    data = {}
    if form.is_bound:
        form.is_valid()
        data = form.cleaned_data
    if data.get("server"):
        tasks = tasks.filter(server=data["server"])
    if data.get("tool"):
        tasks = tasks.filter(tool=data["tool"].strip())
    if data.get("launched_by"):
        tasks = tasks.filter(launched_by__username=data["launched_by"].strip())
    if data.get("q"):
        tasks = tasks.filter(status_message__icontains=data["q"].strip())
    return tasks, data.get("status") or ""
