"""taskhub/database/compiled.py: a read whose SQL the ORM compiles once per connection and key, then runs again with
each call's moments put in; and tasks/visible_reads.py, which keeps it for those who see every task."""

import datetime

import pytest
from django.contrib.auth.models import Group
from django.db import connections
from django.db.models import Count
from django.db.models.functions import Trunc

from taskhub.accounts import permissions
from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.approvals.services import create_policy
from taskhub.database import compiled
from taskhub.servers.services import create_server
from taskhub.tasks import visible_reads
from taskhub.tasks.models import Task, TaskStatus
from taskhub.tasks.queries import tasks_visible_to
from taskhub.tasks.visible_reads import visible_rows
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db

NOW = datetime.datetime(2026, 12, 4, 15, 40, tzinfo=datetime.UTC)
HOUR = datetime.timedelta(hours=1)


@pytest.fixture(autouse=True)
def nothing_compiled():
    compiled.forget_compiled_reads()
    yield
    compiled.forget_compiled_reads()


@pytest.fixture
def ended_tasks():
    server = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    for n, status in enumerate([TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.COMPLETED, TaskStatus.CANCELLED]):
        task = Task.objects.create(server=server, tool=f"tool-{n % 2}", status=status)
        Task.objects.filter(pk=task.pk).update(created_at=NOW - n * HOUR, finished_at=NOW - n * HOUR)
    return server


def ended_per_hour(tasks, since):
    return (
        tasks.filter(finished_at__gte=since)
        .order_by()
        .annotate(per=Trunc("finished_at", "hour", tzinfo=datetime.UTC))
        .values_list("per", "status")
        .annotate(n=Count("*"))
        .order_by("per", "status")
    )


def test_a_read_is_compiled_once_and_gives_the_orms_rows_for_each_moment(ended_tasks):
    built = []

    def build(since):
        built.append(since)
        return ended_per_hour(Task.objects.all(), since)

    for since in (NOW - 10 * HOUR, NOW - 2 * HOUR, NOW + HOUR, NOW - 3 * HOUR):
        rows = compiled.compiled_rows(("test", "ended"), build, [since])
        assert rows == list(ended_per_hour(Task.objects.all(), since))
    assert rows == [
        (NOW.replace(minute=0) - 3 * HOUR, "cancelled", 1),
        (NOW.replace(minute=0) - 2 * HOUR, "completed", 1),
        (NOW.replace(minute=0) - HOUR, "failed", 1),
        (NOW.replace(minute=0), "completed", 1),
    ]
    assert all(row[0].tzinfo is datetime.UTC for row in rows)  # made aware, as the ORM's Trunc does
    assert built == [compiled.stand_in_moment(0)]  # compiled once, with the stand-in


def test_a_read_whose_stand_in_is_nowhere_in_its_parameters_is_the_orms_each_time(ended_tasks):
    built = []

    def build(since):  # the moment goes into the SQL's text, not its parameters
        built.append(since)
        return Task.objects.extra(where=[f"finished_at >= '{since.isoformat()}'"]).values_list("tool").order_by("tool")

    assert compiled.compiled_rows(("test", "text"), build, [NOW - 2 * HOUR]) == [("tool-0",), ("tool-0",), ("tool-1",)]
    assert compiled.compiled_rows(("test", "text"), build, [NOW]) == [("tool-0",)]
    assert len(built) == 3  # the stand-in's compile, then the ORM's read for each call


def test_nothing_to_read_and_a_read_of_models_are_the_orms(ended_tasks):
    assert compiled.compiled_rows(("test", "none"), lambda since: Task.objects.none().values_list("pk"), [NOW]) == []
    read_models = lambda since: Task.objects.filter(finished_at__gte=since)  # noqa: E731
    models = compiled.compiled_rows(("test", "models"), read_models, [NOW])
    assert [task.status for task in models] == [TaskStatus.COMPLETED]


def test_who_sees_every_task_shares_one_statement_and_an_approver_reads_through_their_own(ended_tasks):
    other = create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=None)
    create_policy(server=other, tool="", groups=[Group.objects.create(name="finance")], user=None)  # not amy's
    Task.objects.filter(pk=Task.objects.create(server=other, tool="t", status="failed").pk).update(finished_at=NOW)
    olga, amy = make_user("olga", OPERATORS), make_user("amy", APPROVERS)
    since = NOW - 10 * HOUR
    assert str(tasks_visible_to(olga).query) == str(Task.objects.all().query)  # nothing of olga's in it
    assert visible_rows(olga, "ended", ended_per_hour, since) == list(ended_per_hour(Task.objects.all(), since))
    assert sum(n for _, _, n in visible_rows(olga, "ended", ended_per_hour, since)) == 5
    # An approver's is written from their policies and groups, and kept under it: beta's task is not amy's, but is
    # bob's (in finance), whose read is his own however often each of them reads.
    bob = make_user("bob", APPROVERS)
    bob.groups.add(Group.objects.get(name="finance"))
    for _ in range(2):
        assert visible_rows(amy, "ended", ended_per_hour, since) == list(ended_per_hour(Task.objects.all(), since))[:-1]
        assert visible_rows(bob, "ended", ended_per_hour, since) == list(ended_per_hour(Task.objects.all(), since))
    kept = connections["default"].__dict__[compiled.KEPT_ON]
    assert sorted(key[0] for key in kept) == ["every task", "these tasks", "these tasks"]


def test_an_approvers_reads_in_one_request_ask_their_tasks_statement_once(ended_tasks, monkeypatch):
    """Home makes three reads over an approver's tasks: the statement they are kept under is compiled once a request."""
    amy = make_user("amy", APPROVERS)
    asked = []
    statement = visible_reads._statement
    monkeypatch.setattr(visible_reads, "_statement", lambda visible: asked.append(1) or statement(visible))
    with permissions.read_once():
        for name in ("ended", "again", "once more"):
            assert visible_rows(amy, name, ended_per_hour, NOW - 10 * HOUR) == list(
                ended_per_hour(Task.objects.all(), NOW - 10 * HOUR)
            )
    assert len(asked) == 1
