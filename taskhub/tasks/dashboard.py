"""The signed-in home page: what waits for this person, their running tasks, what needs attention, servers in
trouble and how the last day's tasks ended. Reads only; every item carries the link to the list that shows it
(the task list's filters, queries.TaskFilterForm, or the inbox).
"""

import datetime
from dataclasses import dataclass, field

from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from taskhub.accounts import permissions
from taskhub.servers.models import Server
from taskhub.tasks.list_links import tasks_href
from taskhub.tasks.models import Task
from taskhub.tasks.outcomes import OUTCOMES, Outcome
from taskhub.tasks.queries import (
    COUNT_CAP,
    NEEDS,
    RUNNING,
    RUNNING_STATUSES,
    capped_counts,
    needs_filter,
    tasks_visible_to,
)
from taskhub.tasks.trend_hours import ENDED_WINDOW, ended_per_hour
from taskhub.tasks.waiting import waiting_count, waiting_for

MY_RUNNING_SHOWN = 5
SERVERS_SHOWN = 10
OUTCOME_WINDOW = ENDED_WINDOW


def count_text(count: int) -> str:
    """A count of queries.capped_count as the page shows it: past the cap, "10,000+"."""
    return f"{COUNT_CAP:,}+" if count > COUNT_CAP else str(count)


@dataclass
class Item:
    label: str
    count: int
    href: str
    kind: str = ""

    @property
    def count_text(self) -> str:
        return count_text(self.count)


@dataclass
class Waiting:
    count: int
    oldest: datetime.datetime | None
    href: str

    @property
    def count_text(self) -> str:
        return count_text(self.count)


@dataclass
class TroubledServer:
    server: Server
    state: str  # "needs_reauthorization", "unreachable" or "failing"
    since: datetime.datetime | None
    error: str
    href: str


@dataclass
class Dashboard:
    waiting: Waiting | None = None  # None: not an approver
    my_running: list[Task] = field(default_factory=list)
    my_running_count: int = 0
    my_running_href: str = ""
    attention: list[Item] = field(default_factory=list)
    servers: list[TroubledServer] = field(default_factory=list)
    outcomes: list[Item] = field(default_factory=list)
    sees_tasks: bool = False
    launches: bool = False  # an operator: has tasks of their own
    sees_servers: bool = False
    agent: bool = False  # in `agents`: launches through API tokens, its tasks are not on the pages

    @property
    def my_running_count_text(self) -> str:
        return count_text(self.my_running_count)

    @property
    def attention_total(self) -> int:
        return sum(item.count for item in self.attention)


def _waiting(user) -> Waiting | None:
    if not permissions.is_approver(user):
        return None
    # "Waiting for me", as the nav, the inbox and the API count it (tasks/waiting.py); the oldest from the
    # (state, created_at) index.
    oldest = waiting_for(user).order_by("created_at").values_list("created_at", flat=True).first()
    return Waiting(count=waiting_count(user), oldest=oldest, href=reverse("tasks:inbox"))


def _troubled_servers(user) -> list[TroubledServer]:
    """Enabled servers that need an admin to connect them again (OAuth, issue 33), are unreachable, or whose last
    contact failed after their last success."""
    since_success = Q(last_success_at__isnull=True) | Q(last_error_at__gt=F("last_success_at"))
    failing = Q(last_error_at__isnull=False) & since_success
    reauthorization = Q(oauth=True, authorization__needs_reauthorization_since__isnull=False)
    servers = (
        Server.objects.filter(enabled=True)
        .filter(Q(unreachable_since__isnull=False) | failing | reauthorization)
        .annotate(reauthorization_since=F("authorization__needs_reauthorization_since"))
    )
    admin = permissions.is_admin(user)
    troubled = []
    shown = servers.only("name", "oauth", "unreachable_since", "last_error", "last_error_at")  # not the catalogue
    for server in shown.order_by("name")[:SERVERS_SHOWN]:
        unreachable = server.unreachable_since is not None
        state = "unreachable" if unreachable else "failing"
        since = server.unreachable_since if unreachable else server.last_error_at
        if server.oauth and server.reauthorization_since is not None:  # what an admin must do comes first
            state, since = "needs_reauthorization", server.reauthorization_since
        troubled.append(
            TroubledServer(
                server=server,
                state=state,
                since=since,
                error=(server.last_error or "")[:300],
                href=reverse("servers:detail", args=[server.pk]) if admin else tasks_href(server=server.pk),
            )
        )
    return troubled


def dashboard(user, *, now: datetime.datetime | None = None) -> Dashboard:
    now = now or timezone.now()
    board = Dashboard(waiting=_waiting(user))
    visible = tasks_visible_to(user)
    board.sees_tasks = permissions.is_operator(user) or permissions.is_approver(user)
    board.agent = permissions.is_agent(user)
    if not board.sees_tasks:
        return board

    board.launches = permissions.is_operator(user)
    mine = visible.filter(launched_by=user, status__in=RUNNING_STATUSES)
    counted = [mine] if board.launches else []
    counted += [visible.filter(needs_filter(kind, now)) for kind, _ in NEEDS]
    counts = capped_counts(counted)
    if board.launches:
        board.my_running_count = counts.pop(0)
        if board.my_running_count:
            shown = mine.select_related("server").only("tool", "status", "server__name")  # what the card shows
            board.my_running = list(shown.order_by("-created_at")[:MY_RUNNING_SHOWN])
        board.my_running_href = tasks_href(mine="on", status=RUNNING)

    board.attention = [
        Item(label=label, count=count, href=tasks_href(needs=kind), kind=kind)
        for (kind, label), count in zip(NEEDS, counts, strict=True)
    ]

    # The chart of Home's trends takes its current hour from these too (the same `now`: web.views.home).
    per_hour = ended_per_hour(user, now=now)
    counts = {value: sum(hour.get(value, 0) for hour in per_hour.values()) for value, _, _ in OUTCOMES}
    board.outcomes = [
        Item(label=words, count=counts.get(value, 0), href=tasks_href(outcome=value, ended=OUTCOME_WINDOW), kind=value)
        for value, words, _ in OUTCOMES
        if value != Outcome.UNKNOWN  # it never ends (no finished_at): "needs attention" counts it
    ]

    board.sees_servers = permissions.sees_all_tasks(user)
    if board.sees_servers:
        board.servers = _troubled_servers(user)
    return board
