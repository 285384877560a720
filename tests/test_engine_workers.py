"""The engine across real processes: `manage.py worker` subprocesses, the demo MCP server over HTTP, Postgres.

Issue 3's acceptance: a whole approval without a browser; two workers sharing 200 live tasks without
ever polling one task at once; a worker killed with SIGKILL while holding leases over 100 tasks, with
every answer delivered exactly once; the MCP server down for 30 s without a task marked failed.
Issue 20's: a worker killed with SIGKILL right after 30 answers were submitted, its answers at the server and its
tasks followed again within seconds (its heartbeat, not its leases' expiry or the once-a-minute sweep); and one
killed while its tasks/update was on its way, the answer sent again by the other within seconds. Both with the
production heartbeat and settle times.
"""

from __future__ import annotations

import datetime
import re
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from taskhub.audit.models import AuditEvent
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskPoll
from taskhub.worker.models import WorkerHeartbeat
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.helpers import wait_until
from tests.stack_fixtures import demo_stats, statuses, worker_log
from tests.update_holding_proxy import UpdateHoldingProxy

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

APPROVE = {"action": "accept", "content": {"approved": True, "reason": "ok"}}


@pytest.fixture
def operator():
    return get_user_model().objects.create_user(username="olga", password="x")


@pytest.fixture
def approver():
    return get_user_model().objects.create_user(username="ada", password="x")


def register(demo: DemoServer, user):
    server = create_server(name=f"demo-{demo.port}", transport="http", url=demo.url, user=user)
    return with_tools(server, "approval", "progress")


def test_an_approval_end_to_end_through_a_worker(workers, operator, approver):
    with DemoServer("--poll-interval-ms", "200") as demo:
        server = register(demo, operator)
        task = services.launch(server=server, tool="approval", arguments={"action": "deploy"}, user=operator)
        workers.start("solo")
        request = wait_until(
            lambda: InputRequest.objects.filter(task=task, state=InputRequestState.OPEN).first(),
            timeout=30,
            what="the approval request",
        )
        services.answer_input(input_request=request, response=APPROVE, user=approver)
        wait_until(lambda: Task.objects.get(pk=task.pk).status == "completed", timeout=30, what="completion")

    task.refresh_from_db()
    assert task.result["content"][0]["text"] == "approved: deploy (reason: ok)"
    request.refresh_from_db()
    assert request.state == InputRequestState.DELIVERED
    trail = list(AuditEvent.objects.filter(task_id=task.pk).order_by("id").values_list("action", "actor_label"))
    actions = [action for action, _ in trail]
    for expected in ("task.launched", "task.input_requested", "input.answered", "input.delivered"):
        assert expected in actions, trail
    assert actions.index("task.launched") < actions.index("task.input_requested") < actions.index("input.answered")
    assert actions.index("input.answered") < actions.index("input.delivered")
    assert ("task.launched", "olga") in trail
    assert ("input.answered", "ada") in trail
    changes = AuditEvent.objects.filter(task_id=task.pk, action="task.status_changed").order_by("id")
    assert [event.data["to"] for event in changes][-1] == "completed", trail


def test_two_workers_share_200_live_tasks_without_polling_one_twice_at_once(workers, operator):
    with DemoServer("--poll-interval-ms", "1000", "--get-delay-ms", "50") as demo:
        server = register(demo, operator)
        tasks = [
            services.launch(server=server, tool="progress", arguments={"steps": 3, "step_ms": 2000}, user=operator)
            for _ in range(200)
        ]
        workers.start("alpha")
        workers.start("beta")
        wait_until(
            lambda: statuses(tasks).get("completed") == 200,
            timeout=120,
            interval=1,
            what="200 tasks completed",
        )
        stats = demo_stats(demo)

    ids = {t.remote_task_id for t in Task.objects.filter(pk__in=[t.pk for t in tasks])}
    assert len(ids) == 200
    assert max(stats["max_concurrent_polls"][task_id] for task_id in ids) == 1
    # 6 s of work polled every second: a handful of polls each, never a burst.
    assert max(stats["polls"][task_id] for task_id in ids) <= 12
    assert not TaskPoll.objects.filter(task__in=tasks).exists(), "finished tasks are no longer tracked"


def test_a_worker_killed_while_holding_leases_loses_nothing(workers, operator, approver):
    with DemoServer("--poll-interval-ms", "500") as demo:
        server = register(demo, operator)
        tasks = [
            services.launch(server=server, tool="approval", arguments={"action": f"job {n}"}, user=operator)
            for n in range(100)
        ]
        doomed = workers.start("doomed")
        workers.start("survivor")
        open_requests = wait_until(
            lambda: (
                list(InputRequest.objects.filter(task__in=tasks, state=InputRequestState.OPEN))
                if InputRequest.objects.filter(task__in=tasks, state=InputRequestState.OPEN).count() == 100
                else None
            ),
            timeout=90,
            interval=0.5,
            what="100 open approval requests",
        )
        for request in open_requests:
            services.answer_input(input_request=request, response=APPROVE, user=approver)
        time.sleep(0.3)  # the doomed worker is now busy delivering and polling
        doomed.kill()
        doomed.wait()
        wait_until(
            lambda: statuses(tasks).get("completed") == 100,
            timeout=240,
            interval=1,
            what="all 100 tasks completed after the kill",
        )
        # An answer the doomed worker sent but did not record is confirmed by the survivor's next poll, or, if
        # that poll was asked before the send, by the recovered job's own tasks/get once the attempt has settled.
        wait_until(
            lambda: InputRequest.objects.filter(task__in=tasks, state=InputRequestState.DELIVERED).count() == 100,
            timeout=180,
            interval=1,
            what="all 100 answers recorded as delivered",
        )
        stats = demo_stats(demo)

    keys = [f"{t.remote_task_id}/approve" for t in Task.objects.filter(pk__in=[t.pk for t in tasks])]
    assert sorted(stats["deliveries"].get(key, 0) for key in set(keys)) == [1] * 100


# The goal: a dead worker's answers reach the server, and its tasks are followed again, within this long
# (10-11 s on a quiet machine; the tests print the figure). The tests allow twice as long, because the other
# pytest worker shares the two cores: that still tells the heartbeat take-over from the paths it replaced (the
# lease's expiry, the once-a-minute sweep: 28-87 s), while a figure from a loaded machine is no measurement.
RECOVERY_GOAL_SECONDS = 15
RECOVERY_LIMIT_SECONDS = 2 * RECOVERY_GOAL_SECONDS
# The workers' production defaults (taskhub/settings.py), which production_timed_workers runs them with.
PRODUCTION_STALLED_WORKER_SECONDS = 10


def silence_noticed(survivor: str, dead: str) -> float:
    """How long `dead` had been silent when `survivor` took its work over (its log says so): at least the production
    stalled time, which shows the workers ran with it (tests/settings.py makes it 6 s elsewhere)."""
    log = worker_log(survivor).read_text()
    found = re.search(rf"worker {re.escape(dead)} has not beaten for ([0-9.]+) s", log)
    assert found, f"{survivor} never took {dead}'s work over:\n{log[-3000:]}"
    return float(found.group(1))


def beating_steadily(*names: str) -> None:
    """Wait until the workers `names` have beaten for the stalled time: only then do they judge others (as workers
    running for a while in production do), so the recovery time counts from the kill, not from their start."""
    wait_until(
        lambda: (
            WorkerHeartbeat.objects.filter(
                owner__in=names,
                started_at__lte=timezone.now() - datetime.timedelta(seconds=PRODUCTION_STALLED_WORKER_SECONDS + 0.5),
            ).count()
            == len(names)
        ),
        timeout=60,
        interval=0.2,
        what=f"workers {names} beating for {PRODUCTION_STALLED_WORKER_SECONDS} s",
    )


def test_a_killed_workers_answers_reach_the_server_once_within_seconds(production_timed_workers, operator, approver):
    workers = production_timed_workers
    # The server holds each tasks/update a little (and applies it even if its sender died meanwhile), so that the
    # doomed worker has answers in flight, sent and not yet acknowledged, when it dies.
    with DemoServer("--poll-interval-ms", "500", "--update-delay-ms", "300") as demo:
        server = register(demo, operator)
        tasks = [
            services.launch(server=server, tool="approval", arguments={"action": f"job {n}"}, user=operator)
            for n in range(30)
        ]
        # Leases as long as in production: the tasks must move on the doomed worker's silence, not their expiry.
        doomed = workers.start("doomed", "--lease-seconds", "30")
        workers.start("survivor", "--lease-seconds", "30")
        requests = wait_until(
            lambda: (requests := open_requests(tasks)) and len(requests) == 30 and requests,
            timeout=60,
            what="30 open approval requests",
        )
        beating_steadily("doomed", "survivor")
        assert TaskPoll.objects.filter(task__in=tasks, lease_owner="doomed").exists(), "the doomed worker follows none"
        with transaction.atomic():  # submitted at once: both workers take their deliveries together
            for request in requests:
                services.answer_input(input_request=request, response=APPROVE, user=approver)
        wait_until(
            lambda: InputRequest.objects.filter(task__in=tasks, delivery_attempted_at__isnull=False).exists(),
            timeout=10,
            interval=0.01,
            what="the first delivery to start",
        )
        doomed.kill()
        killed = time.monotonic()
        doomed.wait()
        in_flight = InputRequest.objects.filter(
            task__in=tasks, delivery_attempted_by="doomed", state=InputRequestState.ANSWERED
        ).count()

        keys = {f"{task.remote_task_id}/approve" for task in Task.objects.filter(pk__in=[t.pk for t in tasks])}
        wait_until(
            lambda: keys <= demo_stats(demo)["deliveries"].keys(),
            timeout=RECOVERY_LIMIT_SECONDS - (time.monotonic() - killed),
            interval=0.1,
            what=f"every answer at the server within {RECOVERY_LIMIT_SECONDS} s of the kill",
        )
        answers_after = time.monotonic() - killed
        wait_until(lambda: statuses(tasks).get("completed") == 30, timeout=60, interval=0.1, what="every task ended")
        ended_after = time.monotonic() - killed
        print(
            f"\nrecovery after kill -9: every answer at the server {answers_after:.1f} s after the kill,"
            f" every task ended {ended_after:.1f} s after it ({in_flight} of its deliveries were under way)"
        )
        wait_until(
            lambda: InputRequest.objects.filter(task__in=tasks, state=InputRequestState.DELIVERED).count() == 30,
            timeout=30,
            what="every answer recorded as delivered",
        )
        stats = demo_stats(demo)

    assert {key: stats["deliveries"][key] for key in keys} == dict.fromkeys(keys, 1)
    assert ended_after <= RECOVERY_LIMIT_SECONDS, f"tasks followed again only {ended_after:.1f} s after the kill"
    assert silence_noticed("survivor", "doomed") >= PRODUCTION_STALLED_WORKER_SECONDS


def test_an_answer_cut_off_mid_send_by_a_killed_worker_is_sent_again_once_within_seconds(
    production_timed_workers, operator, approver
):
    """A worker is killed while its tasks/update is on its way (held by a proxy, which drops it when the worker's
    connection closes: the server never sees it). The other worker finds it dead, asks the server after the short
    grace, and sends the answer again, once, well before the long settle time (40 s) would have let it."""
    workers = production_timed_workers
    with DemoServer("--poll-interval-ms", "500") as demo:
        proxy = UpdateHoldingProxy(demo.url).start()
        try:
            server = with_tools(create_server(name="held", transport="http", url=proxy.url, user=operator), "approval")
            task = services.launch(server=server, tool="approval", arguments={"action": "deploy"}, user=operator)
            workers.start("east", "--lease-seconds", "30")
            workers.start("west", "--lease-seconds", "30")
            [request] = wait_until(lambda: open_requests([task]), timeout=60, what="the approval request")
            beating_steadily("east", "west")
            services.answer_input(input_request=request, response=APPROVE, user=approver)
            wait_until(lambda: proxy.held == 1, timeout=30, interval=0.05, what="the tasks/update on its way")
            sender = InputRequest.objects.get(pk=request.pk).delivery_attempted_by
            assert sender in {"east", "west"}, sender
            survivor = ({"east", "west"} - {sender}).pop()

            workers.processes[sender].kill()
            killed = time.monotonic()
            workers.processes[sender].wait()
            wait_until(lambda: proxy.dropped == 1, timeout=5, interval=0.05, what="the cut-off request dropped")
            proxy.release_all()  # what comes next goes through
            key = f"{Task.objects.get(pk=task.pk).remote_task_id}/approve"
            wait_until(
                lambda: key in demo_stats(demo)["deliveries"],
                timeout=RECOVERY_LIMIT_SECONDS - (time.monotonic() - killed),
                interval=0.1,
                what=f"the answer at the server within {RECOVERY_LIMIT_SECONDS} s of the kill",
            )
            sent_again_after = time.monotonic() - killed
            wait_until(lambda: Task.objects.get(pk=task.pk).status == "completed", timeout=30, what="the task ended")
            print(f"\nanswer cut off mid-send by kill -9: sent again {sent_again_after:.1f} s after the kill")
            wait_until(
                lambda: InputRequest.objects.get(pk=request.pk).state == InputRequestState.DELIVERED,
                timeout=30,
                what="the answer recorded as delivered",
            )
            deliveries = demo_stats(demo)["deliveries"]
        finally:
            proxy.stop()

    assert deliveries[key] == 1
    assert proxy.dropped == 1
    assert silence_noticed(survivor, sender) >= PRODUCTION_STALLED_WORKER_SECONDS
    request.refresh_from_db()
    assert request.delivery_attempted_by == survivor
    delivered = AuditEvent.objects.get(task_id=task.pk, action="input.delivered")
    assert "confirmed_by" not in delivered.data  # sent (and acknowledged) by the survivor, not found received


def open_requests(tasks: list[Task]) -> list[InputRequest]:
    return list(InputRequest.objects.filter(task__in=tasks, state=InputRequestState.OPEN))


def test_an_mcp_server_down_for_several_backoff_caps_fails_no_task(workers, operator, tmp_path, settings):
    demo = DemoServer("--poll-interval-ms", "500", "--state", str(tmp_path / "demo.sqlite3")).start()
    try:
        server = register(demo, operator)
        tasks = [
            services.launch(server=server, tool="progress", arguments={"steps": 10, "step_ms": 1000}, user=operator)
            for _ in range(20)
        ]
        workers.start("steady")
        wait_until(lambda: statuses(tasks).get("working") == 20, timeout=60, what="20 working tasks")
        demo.kill()
        # Down long enough for the worker's backoff to reach its cap (TASKHUB_POLL_BACKOFF_CAP_SECONDS, short in
        # tests; 30 s in production) and stay there for a few polls.
        wait_until(
            lambda: Server.objects.filter(pk=server.pk, unreachable_since__isnull=False).exists(),
            timeout=30,
            what="the server marked unreachable",
        )
        # Backoff 1 s, then the cap (2 s in tests): at the cap from the second failure, three polls there by the fifth.
        wait_until(
            lambda: min(TaskPoll.objects.filter(task__in=tasks).values_list("consecutive_failures", flat=True)) >= 5,
            timeout=90,
            interval=0.5,
            what="five failed polls of every task, the last three at the backoff's cap",
        )
        server.refresh_from_db()
        assert server.unreachable_since is not None
        assert "failed" not in statuses(tasks)
        demo.start()
        wait_until(lambda: statuses(tasks).get("completed") == 20, timeout=90, interval=1, what="completion")
        server.refresh_from_db()
        assert server.unreachable_since is None
    finally:
        demo.stop()
