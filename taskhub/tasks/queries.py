"""Which tasks a person asks for: the filters of the task list page (shared with the JSON API and the home page's
links), each task's outcome, and the checks of a filter form that both the task list and the inbox report.

Every filter lives in the URL. A value that does not fit is reported (filter_errors) and left out of the filter.
"""

import datetime
import functools
import re
import uuid

from django import forms
from django.db import connections
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy, pgettext_lazy

from taskhub.accounts import permissions
from taskhub.acyclic_forms import AcyclicForm
from taskhub.audit.models import AuditEvent, agent_label
from taskhub.database.prepared import prepared_cursor
from taskhub.observability import counts as kept_counts
from taskhub.servers.forms import ServerFilterField
from taskhub.servers.models import Server
from taskhub.tasks.models import Task, TaskStatus
from taskhub.tasks.outcomes import OUTCOME_WORDS, OUTCOMES, outcome_filter

OTHER = "other"
RUNNING = "running"
OTHER_STATUSES = (TaskStatus.LAUNCHING, TaskStatus.LAUNCH_UNKNOWN, TaskStatus.EXPIRED, TaskStatus.LOST)
RUNNING_STATUSES = (TaskStatus.LAUNCHING, TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED)
# (value of ?status=, label, statuses it covers); "" is All.
TABS = (
    ("", pgettext_lazy("tab", "All"), None),
    (TaskStatus.WORKING.value, pgettext_lazy("tab", "Working"), (TaskStatus.WORKING,)),
    (TaskStatus.INPUT_REQUIRED.value, pgettext_lazy("tab", "Needs input"), (TaskStatus.INPUT_REQUIRED,)),
    (TaskStatus.COMPLETED.value, pgettext_lazy("tab", "Completed"), (TaskStatus.COMPLETED,)),
    (TaskStatus.FAILED.value, pgettext_lazy("tab", "Failed"), (TaskStatus.FAILED,)),
    (TaskStatus.CANCELLED.value, pgettext_lazy("tab", "Cancelled"), (TaskStatus.CANCELLED,)),
    (OTHER, pgettext_lazy("tab", "Other"), OTHER_STATUSES),
)
# ?status= takes a tab, "running", or any one status (the home page links to them).
TAB_STATUSES = {
    **{value: statuses for value, _, statuses in TABS},
    RUNNING: RUNNING_STATUSES,
    **{status.value: (status,) for status in TaskStatus},
    TaskStatus.LOST: (TaskStatus.LOST,),
}
STATUS_CHOICES = [(value, label) for value, label, _ in TABS] + [
    (RUNNING, pgettext_lazy("tab", "Running")),
    *((status.value, status.label) for status in OTHER_STATUSES if isinstance(status, TaskStatus)),
    (TaskStatus.LOST, pgettext_lazy("task status", "lost")),
]

# --- what needs attention ------------------------------------------------------------------------------------

CANCEL_SLOW_AFTER = datetime.timedelta(minutes=1)
EXPIRING_WITHIN = datetime.timedelta(hours=1)
PROTOCOL_ERRORS_WITHIN = datetime.timedelta(hours=24)


class Needs:
    LAUNCH_RETRYING = "launch_retrying"
    LAUNCH_UNKNOWN = "launch_unknown"
    CANCEL_NOT_HONOURED = "cancel_not_honoured"
    PROTOCOL_ERROR = "protocol_error"
    EXPIRING = "expiring"


NEEDS = (
    (Needs.LAUNCH_RETRYING, gettext_lazy("launch retrying")),
    (Needs.LAUNCH_UNKNOWN, gettext_lazy("launch outcome unknown")),
    (Needs.CANCEL_NOT_HONOURED, gettext_lazy("cancel requested, still running")),
    (Needs.PROTOCOL_ERROR, gettext_lazy("protocol errors in the last 24 hours")),
    (Needs.EXPIRING, gettext_lazy("expiring within the hour")),
)


def needs_filter(kind: str, now: datetime.datetime | None = None) -> Q:
    now = now or timezone.now()
    if kind == Needs.LAUNCH_RETRYING:
        # At least one attempt could not reach the server (services.record_launch_retry).
        return Q(status=TaskStatus.LAUNCHING, launch_attempts__gt=0)
    if kind == Needs.LAUNCH_UNKNOWN:
        return Q(status=TaskStatus.LAUNCH_UNKNOWN)
    if kind == Needs.CANCEL_NOT_HONOURED:
        return Q(
            status__in=(TaskStatus.LAUNCHING, TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED),
            cancel_requested_at__lt=now - CANCEL_SLOW_AFTER,
        )
    if kind == Needs.PROTOCOL_ERROR:
        recent = AuditEvent.objects.filter(
            action="task.protocol_error", time__gte=now - PROTOCOL_ERRORS_WITHIN, task_id__isnull=False
        )
        return Q(pk__in=recent.values("task_id"))
    if kind == Needs.EXPIRING:
        # The server's createdAt + ttlMs (taskhub/tasks/ttl.py), as the expiry sweep counts it; the index
        # task_live_expires finds the few expiring among many running at once.
        return Q(status__in=(TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED), expires_at__lt=now + EXPIRING_WITHIN)
    raise ValueError(kind)


# --- the filter form -----------------------------------------------------------------------------------------


def tasks_visible_to(user, *, through_token: bool = False) -> QuerySet[Task]:
    """The tasks this user may see: all for operators and admins, those of the servers they approve for an
    approver, none for anyone else. The task list filters by it; the detail page and the live socket agree.

    `through_token`: for a caller with an API token, where an agent also sees the tasks it launched
    (permissions.may_see_task_through_token)."""
    if permissions.sees_all_tasks(user):
        return Task.objects.all()
    own = Q(launched_by=user) if through_token and permissions.is_agent(user) else Q(pk__in=[])
    if not permissions.is_approver(user):
        return Task.objects.filter(own) if through_token else Task.objects.none()
    return Task.objects.filter(Q(server__in=permissions.servers_user_may_approve(user)) | own)


# ?agent=: launched by an agent (any API token), by a person (none), or one token's id.
ANY_AGENT = "any"
NO_AGENT = "none"


def agent_choices(user) -> list[tuple[str, str]]:
    """The agent filter's choices: a person's own API tokens (every token for admins), revoked first, by name."""
    everyone = permissions.is_admin(user)
    with prepared_cursor() as cursor:
        cursor.execute(_agent_tokens_sql(everyone), [] if everyone else [user.pk])
        rows = cursor.fetchall()
    tokens = [
        (
            str(pk),
            agent_label({"name": name, "prefix": prefix})
            + (f" · {username}" if everyone else "")
            + (" · " + str(gettext_lazy("revoked")) if revoked_at else ""),
        )
        for pk, name, prefix, revoked_at, username in rows
    ]
    return [
        ("", gettext_lazy("people and agents")),
        (ANY_AGENT, gettext_lazy("launched by an agent")),
        (NO_AGENT, gettext_lazy("launched by a person")),
        *tokens,
    ]


@functools.cache
def _agent_tokens_sql(everyone: bool) -> str:
    """Prepared once: the ORM built it for every whole list page (0.5-0.7 ms). Tasks never import the API."""
    tokens = Task._meta.get_field("launched_via_token").related_model
    people = tokens._meta.get_field("user").related_model
    username = people._meta.get_field(people.USERNAME_FIELD).column
    mine = "" if everyone else "WHERE t.user_id = %s "
    return (
        f'SELECT t.id, t.name, t.prefix, t.revoked_at, u."{username}" '
        f'FROM "{tokens._meta.db_table}" t JOIN "{people._meta.db_table}" u ON u.id = t.user_id '
        f"{mine}ORDER BY t.revoked_at, t.name, t.id"
    )


def agent_filter(value: str) -> Q:
    if value == ANY_AGENT:
        return ~Q(launched_via_label="")  # as the partial index task_agent_created has it
    if value == NO_AGENT:
        return Q(launched_via_label="")
    return Q(launched_via_token_id=int(value))


def filter_errors(form: forms.Form) -> dict[str, str]:
    """The fields of a bound filter form that do not fit, each with one message naming the value it got.
    The task list and the inbox both report them this way; their valid filters still apply."""
    if not form.is_bound:
        return {}
    form.is_valid()
    return {name: " ".join(messages) for name, messages in form.errors.items()}


def _choices(choices) -> str:
    return ", ".join(value for value, _ in choices if value)


# ?ended=: the tasks that ended within the last …
ENDED_WITHIN = {
    "1h": datetime.timedelta(hours=1),
    "24h": datetime.timedelta(hours=24),
    "7d": datetime.timedelta(days=7),
}
ENDED_CHOICES = [
    ("", gettext_lazy("any time")),
    ("1h", gettext_lazy("in the last hour")),
    ("24h", gettext_lazy("in the last 24 hours")),
    ("7d", gettext_lazy("in the last 7 days")),
]


# ?older=: the tasks started more than … ago (their age), e.g. to cancel the ones stuck for a day.
OLDER_THAN = {
    "10m": datetime.timedelta(minutes=10),
    "1h": datetime.timedelta(hours=1),
    "24h": datetime.timedelta(hours=24),
    "7d": datetime.timedelta(days=7),
}
OLDER_CHOICES = [
    ("", gettext_lazy("any age")),
    ("10m", gettext_lazy("over 10 minutes ago")),
    ("1h", gettext_lazy("over an hour ago")),
    ("24h", gettext_lazy("over a day ago")),
    ("7d", gettext_lazy("over a week ago")),
]


class TaskFilterForm(AcyclicForm):
    """The filter bar; every field optional. A value that does not fit is reported and left out of the filter."""

    status = forms.ChoiceField(
        required=False,
        choices=STATUS_CHOICES,
        error_messages={
            "invalid_choice": format_lazy(
                gettext_lazy("There is no status “%(value)s”: use one of {}."), _choices(STATUS_CHOICES)
            )
        },
    )
    outcome = forms.ChoiceField(
        required=False,
        choices=[("", gettext_lazy("any outcome")), *((value, words) for value, words, _ in OUTCOMES)],
        error_messages={
            "invalid_choice": format_lazy(
                gettext_lazy("There is no outcome “%(value)s”: use one of {}."), ", ".join(OUTCOME_WORDS)
            )
        },
    )
    needs = forms.ChoiceField(
        required=False,
        choices=[("", "—"), *NEEDS],
        label=gettext_lazy("Needs attention"),
        error_messages={
            "invalid_choice": format_lazy(
                gettext_lazy("“%(value)s” is not a kind of attention: use one of {}."), _choices(NEEDS)
            )
        },
    )
    server = ServerFilterField(
        required=False,
        queryset=Server.objects.none(),
        empty_label=gettext_lazy("any server"),
        error_messages={
            "invalid_choice": gettext_lazy("There is no server with that id among those whose tasks you may see.")
        },
    )
    tool = forms.CharField(required=False, max_length=200, label=gettext_lazy("Tool (part of its name)"))
    launched_by = forms.CharField(required=False, max_length=150, label=gettext_lazy("Launched by"))
    agent = forms.ChoiceField(
        required=False,
        label=gettext_lazy("Agent"),
        error_messages={
            "invalid_choice": gettext_lazy(
                "There is no API token “%(value)s” among those you may see: choose one from the list."
            )
        },
    )
    mine = forms.BooleanField(required=False, label=gettext_lazy("My tasks"))
    q = forms.CharField(
        required=False,
        max_length=200,
        label=gettext_lazy("Search"),
        help_text=gettext_lazy("task id (ours or the server's), tool, arguments, result text, status message"),
    )
    ended = forms.ChoiceField(
        required=False,
        choices=ENDED_CHOICES,
        label=gettext_lazy("Ended"),
        error_messages={
            "invalid_choice": format_lazy(gettext_lazy("“Ended” takes {}, not “%(value)s”."), _choices(ENDED_CHOICES))
        },
    )
    older = forms.ChoiceField(
        required=False,
        choices=OLDER_CHOICES,
        label=gettext_lazy("Started"),
        error_messages={
            "invalid_choice": format_lazy(gettext_lazy("“Started” takes {}, not “%(value)s”."), _choices(OLDER_CHOICES))
        },
    )
    since = forms.DateField(
        required=False,
        label=gettext_lazy("From"),
        widget=forms.DateInput(attrs={"type": "date"}),
        error_messages={"invalid": gettext_lazy("“From” must be a date like 2026-12-01.")},
    )
    until = forms.DateField(
        required=False,
        label=gettext_lazy("To"),
        widget=forms.DateInput(attrs={"type": "date"}),
        error_messages={"invalid": gettext_lazy("“To” must be a date like 2026-12-01.")},
    )

    def __init__(self, *args, user, through_token: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        visible = tasks_visible_to(user, through_token=through_token)
        visible_servers = Server.objects.filter(pk__in=visible.values("server_id"))
        # Read when a value is checked or the field is drawn, once: the list's live re-fetch draws no filter form.
        self.fields["agent"].choices = functools.cache(functools.partial(agent_choices, user))
        self.fields["server"].queryset = visible_servers.order_by("name")
        for name in ("tool", "launched_by", "q"):
            self.fields[name].widget.attrs["autocomplete"] = "off"
        self.fields["q"].widget.attrs["placeholder"] = gettext_lazy("id, tool, arguments, result, message")
        self.fields["q"].widget.attrs["title"] = self.fields["q"].help_text

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            # Neither applies: which one is wrong is not known.
            self.add_error(
                "until",
                gettext_lazy("“To” (%(until)s) is before “From” (%(since)s); the dates were not applied.")
                % {"until": until, "since": since},
            )
            data.pop("since", None)
        return data


HEX_PREFIX = re.compile(r"^[0-9a-f]{4,32}$")


def id_prefix_filter(text: str) -> Q | None:
    """Our task ids starting with `text` (4 to 32 hex digits, dashes ignored), as a range of the primary key."""
    digits = text.lower().replace("-", "")
    if not HEX_PREFIX.match(digits):
        return None
    low = uuid.UUID(digits.ljust(32, "0"))
    high = uuid.UUID(digits.ljust(32, "f"))
    return Q(pk__gte=low, pk__lte=high)


# One text of everything the search looks in, as migration 0006's trigram index task_search_trgm has it: one index
# scan answers a search (five ORed columns made the planner read every task instead). Each ::text cast and || is
# immutable, so Postgres can index it; a NULL column adds nothing.
SEARCH_TEXT_SQL = (
    "UPPER(COALESCE({t}status_message, '') || chr(10) || {t}tool::text"
    " || chr(10) || COALESCE({t}remote_task_id::text, '')"
    " || chr(10) || COALESCE({t}arguments::text, '')"
    " || chr(10) || COALESCE({t}result::text, ''))"
)


def search(tasks: QuerySet[Task], text: str) -> QuerySet[Task]:
    """Tasks whose status message, tool, server's task id, arguments or result contain `text` (any case), or whose
    id (ours) starts with it."""
    found = Q(search_text__contains=text.upper())
    by_id = id_prefix_filter(text)
    tasks = tasks.alias(search_text=RawSQL(SEARCH_TEXT_SQL.format(t='"tasks_task".'), ()))
    return tasks.filter(found | by_id if by_id is not None else found)


def _day_start(day: datetime.date) -> datetime.datetime:
    return datetime.datetime.combine(day, datetime.time.min, tzinfo=datetime.UTC)


def filtered_tasks(form: TaskFilterForm, user, *, through_token: bool = False):
    """The tasks `user` may see, narrowed by the form's valid filters; and the status tab asked for."""
    tasks = tasks_visible_to(user, through_token=through_token)
    # A bound form's cleaned_data holds the fields that are fine; the others are reported and left out.
    filter_errors(form)
    data = getattr(form, "cleaned_data", {}) if form.is_bound else {}
    if data.get("server"):
        tasks = tasks.filter(server=data["server"])
    if data.get("tool", "").strip():
        tasks = tasks.filter(tool__icontains=data["tool"].strip())
    if data.get("launched_by", "").strip():
        tasks = tasks.filter(launched_by__username=data["launched_by"].strip())
    if data.get("mine"):
        tasks = tasks.filter(launched_by=user)
    if data.get("agent"):
        tasks = tasks.filter(agent_filter(data["agent"]))
    if data.get("q", "").strip():
        tasks = search(tasks, data["q"].strip())
    if data.get("since"):
        tasks = tasks.filter(created_at__gte=_day_start(data["since"]))
    if data.get("until"):
        tasks = tasks.filter(created_at__lt=_day_start(data["until"] + datetime.timedelta(days=1)))
    if data.get("older"):
        tasks = tasks.filter(created_at__lt=timezone.now() - OLDER_THAN[data["older"]])
    if data.get("ended"):
        tasks = tasks.filter(finished_at__gte=timezone.now() - ENDED_WITHIN[data["ended"]])
    if data.get("needs"):
        tasks = tasks.filter(needs_filter(data["needs"]))
    if data.get("outcome"):
        tasks = tasks.filter(outcome_filter(data["outcome"]))
    return tasks, data.get("status") or ""


# --- counting at scale ---------------------------------------------------------------------------------------

# Above this many matching tasks a filtered list says "10,000+" rather than count a million rows per request.
COUNT_CAP = 10_000


def capped_count(tasks: QuerySet) -> int:
    """How many rows `tasks` has, but at most COUNT_CAP + 1 (more than COUNT_CAP: the count stops there)."""
    return capped_counts([tasks])[0]


def capped_counts(querysets: list[QuerySet]) -> list[int]:
    """capped_count of each of `querysets` (of one database), in one statement: Home's counts, one round trip
    and no aggregate query built per count."""
    if not querysets:
        return []
    selects, params = [], []
    for tasks in querysets:
        sql, each = tasks.order_by().values_list("pk")[: COUNT_CAP + 1].query.sql_with_params()
        selects.append(f"(SELECT count(*) FROM ({sql}) AS capped)")
        params.extend(each)
    with connections[querysets[0].db].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(selects), params)
        return list(cursor.fetchone())


def status_counts(tasks: QuerySet[Task], *, kept_server_ids=None, kept: bool = False) -> tuple[dict[str, int], bool]:
    """Tasks per status among `tasks`, and whether the counts stopped at the cap.

    `kept`: `tasks` are every task of the servers in `kept_server_ids` (None: of all servers), so the counts are
    the ones triggers keep per server and status (observability.counts): exact, and no scan. Otherwise at most
    COUNT_CAP + 1 matching tasks are read: below that the counts are exact; above it ({}, True), as which statuses
    the first COUNT_CAP tasks have says nothing of the others."""
    if kept:
        return kept_counts.tasks_per_status(server_ids=kept_server_ids), False
    sql, params = tasks.order_by().values_list("status")[: COUNT_CAP + 1].query.sql_with_params()
    with connections[tasks.db].cursor() as cursor:
        cursor.execute(f"SELECT matching.status, count(*) FROM ({sql}) AS matching GROUP BY 1", params)
        counted = dict(cursor.fetchall())
    if sum(counted.values()) > COUNT_CAP:
        return {}, True
    return counted, False
