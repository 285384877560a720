"""Issue 15's acceptance for bulk cancel: 200 tasks on a real demo server over HTTP, the dry-run count, one confirm,
200 tasks/cancel delivered (the server's own counters) and audited, while a launch to another server is not held up
behind them (told by the order of the audit rows, not by time)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx2
import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.accounts.groups import OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated, TasksClient
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import Task, TaskStatus
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.stack_fixtures import run_worker_until_idle

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]

BULK = 200


@pytest.fixture(scope="module")
def demo_a() -> Iterator[DemoServer]:
    """A demo server of this module's own: its counters hold this test's cancels only."""
    with DemoServer() as demo:
        yield demo


async def _call_long_tools(target, n: int) -> list:
    async with TasksClient(target, timeout=30) as client:
        await client.discover()
        outcomes = []
        for start in range(0, n, 25):
            calls = (client.call_tool("long", {"seconds": 3600}) for _ in range(start, min(n, start + 25)))
            outcomes += await asyncio.gather(*calls)
        return outcomes


def launched_on_the_server(server, user, n: int):
    """`n` durable tasks on the real server, recorded through the services as the launch job records them (one
    client session sends the tools/call, which is quicker than n launch jobs, each with a session of its own)."""
    tasks = [services.launch(server=server, tool="long", arguments={"seconds": 3600}, user=user) for _ in range(n)]
    ProcrastinateJob.objects.all().delete()  # their launch jobs: sent here instead
    outcomes = async_to_sync(_call_long_tools)(server.to_target(), n)
    for task, outcome in zip(tasks, outcomes, strict=True):
        assert isinstance(outcome, TaskCreated), outcome
        services.record_launch_outcome(task=task, outcome=outcome)
    return Task.objects.filter(server=server)


def test_a_bulk_cancel_of_200_tasks_reaches_the_server_and_does_not_hold_up_another_servers_launch(
    demo_a, shared_demo_server, settings
):
    settings.TASKHUB_BULK_CANCEL_PER_SERVER = 4
    olga = make_user("olga", OPERATORS)
    alpha = with_tools(create_server(name="alpha", transport="http", url=demo_a.url, user=None), "long")
    beta = with_tools(create_server(name="beta", transport="http", url=shared_demo_server.url, user=None), "quick")
    tasks = launched_on_the_server(alpha, olga, BULK)
    assert tasks.filter(status=TaskStatus.WORKING).count() == BULK

    client = Client()
    client.force_login(olga)
    html = client.get(reverse("tasks:cancel_many"), {"server": alpha.pk, "status": "working"}).content.decode()
    assert f'data-count="{BULK}" data-skipped="0"' in html
    form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html))
    response = client.post(reverse("tasks:cancel_many"), form)
    assert response.status_code == 302
    # Launched once the 200 cancels are queued: it must not wait behind them.
    other = services.launch(server=beta, tool="quick", arguments={"text": "not held up"}, user=olga)

    async_to_sync(run_worker_until_idle)(timeout=180, concurrency=6)

    # The server's own counters: each of the 200 remote tasks got tasks/cancel exactly once.
    cancels = httpx2.get(f"http://127.0.0.1:{demo_a.port}/demo/stats").json()["cancels"]
    remote_ids = set(tasks.values_list("remote_task_id", flat=True))
    assert {remote: cancels.get(remote) for remote in remote_ids} == dict.fromkeys(remote_ids, 1)
    # Audited: the bulk action with its query and count, and per task the request (naming it) and the delivery.
    [action] = AuditEvent.objects.filter(action="task.bulk_cancel_requested")
    assert action.data["count"] == BULK and action.data["query"] == {"server": str(alpha.pk), "status": "working"}
    requested = AuditEvent.objects.filter(action="task.cancel_requested", data__bulk_action=action.pk)
    assert requested.values("task_id").distinct().count() == BULK
    delivered = AuditEvent.objects.filter(action="task.cancel_delivered", task__server=alpha).order_by("id")
    assert delivered.values("task_id").distinct().count() == BULK == delivered.count()

    # The other server's launch went out while the bulk was under way: its tools/call was sent before half of the
    # cancels were delivered (queued ahead of it, as answers and single cancels are, it would follow all 200).
    other.refresh_from_db()
    assert other.status == TaskStatus.COMPLETED
    sent = AuditEvent.objects.get(task=other, action="task.launch_sent").pk
    halfway = list(delivered.values_list("id", flat=True))[BULK // 2]
    assert sent < halfway, (sent, delivered.filter(id__lt=sent).count())
