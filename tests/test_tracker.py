"""The tracker against real Postgres and the demo MCP server over HTTP: following, intervals, leases, outages.

Each Tracker runs on an event loop of its own in a thread, as it does inside a worker process; the test
thread reads the database through the ORM and the demo server's `/demo/stats`.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from datetime import timedelta
from itertools import pairwise

import httpx2
import psycopg
import pytest
from django.utils import timezone

from taskhub.audit.models import AuditEvent
from taskhub.database.params import database_params
from taskhub.mcp.client import TaskCreated, TasksClient
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.models import Server
from taskhub.servers.services import create_server, update_server
from taskhub.tasks import services
from taskhub.tasks.models import ProgressMessage, Task, TaskPoll, TaskStatus
from taskhub.worker.heartbeats import Heartbeat, dead_owners, is_alive
from taskhub.worker.models import WorkerHeartbeat
from taskhub.worker.tracker.leases import CLAIM_SQL, Claimed, Leases
from taskhub.worker.tracker.polling import TrackerStats
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.helpers import wait_until
from tests.tracker_fixtures import RunningTracker
from tests.wire_recorder import WireRecorder

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST_BACKOFF = {"backoff_base_seconds": 0.2, "backoff_cap_seconds": 1.0}


def register(url: str) -> Server:
    return create_server(name=f"demo {url}", transport="http", url=url, user=None)


async def _call_tools(server: Server, tool: str, arguments: dict, count: int) -> list:
    async with TasksClient(server.to_target()) as client:
        return list(await asyncio.gather(*(client.call_tool(tool, arguments) for _ in range(count))))


def launch_live(server: Server, tool: str, arguments: dict, count: int = 1) -> list[Task]:
    """Launch through the services and record the demo server's real task handles."""
    with_tools(server, tool)
    tasks = [services.launch(server=server, tool=tool, arguments=arguments, user=None) for _ in range(count)]
    outcomes = asyncio.run(_call_tools(server, tool, arguments, count))
    assert all(isinstance(outcome, TaskCreated) for outcome in outcomes), outcomes
    return [services.record_launch_outcome(task=t, outcome=o) for t, o in zip(tasks, outcomes, strict=True)]


def statuses(tasks: list[Task]) -> set[str]:
    return set(Task.objects.filter(pk__in=[t.pk for t in tasks]).values_list("status", flat=True))


def all_completed(tasks: list[Task]) -> bool:
    return statuses(tasks) == {TaskStatus.COMPLETED}


def stats(demo: DemoServer) -> dict:
    return httpx2.get(demo.url.removesuffix("/mcp") + "/demo/stats", timeout=10).json()


def actions(task: Task) -> list[str]:
    return list(AuditEvent.objects.filter(task_id=task.pk).order_by("id").values_list("action", flat=True))


@pytest.fixture(scope="module")
def demo():
    """One demo server for the module: each test follows tasks of its own (the server's task ids are unique)."""
    with DemoServer("--poll-interval-ms", "300") as server:
        yield server


# --- following --------------------------------------------------------------------------------------------


@pytest.mark.embedded
def test_follows_tasks_to_completed_through_the_services(demo):
    server = register(demo.url)
    tasks = launch_live(server, "progress", {"steps": 3, "step_ms": 800}, count=3)
    with RunningTracker(worker_id="w1", listen=False) as running:
        wait_until(lambda: all_completed(tasks), what="every task completed")
    task = Task.objects.get(pk=tasks[0].pk)
    assert task.result["content"][0]["text"] == "finished 3 steps"
    assert task.finished_at is not None and not TaskPoll.objects.filter(task__in=tasks).exists()
    trail = actions(task)
    assert trail[:2] == ["task.launched", "task.launch_answered"]
    assert "task.updated" not in trail and trail[-1] == "task.status_changed"
    assert task.progress_messages.exists()
    assert AuditEvent.objects.filter(task_id=task.pk, action="task.status_changed").last().data["to"] == "completed"
    # Unchanged polls wrote nothing: fewer changes than polls, and one status change per task.
    assert running.tracker.stats.changes < running.tracker.stats.polls
    assert AuditEvent.objects.filter(task_id__in=[t.pk for t in tasks], action="task.status_changed").count() == 3
    assert Server.objects.get(pk=server.pk).last_success_at is not None


def test_polls_of_a_task_are_spaced_by_its_poll_interval(demo):
    recorder = WireRecorder(demo.url).start()
    try:
        server = register(recorder.url)
        tasks = launch_live(server, "progress", {"steps": 8, "step_ms": 300}, count=4)
        with RunningTracker(worker_id="w1", listen=False):
            wait_until(lambda: all_completed(tasks), what="every task completed")
        times = defaultdict(list)
        for exchange in recorder.requests("tasks/get"):
            times[exchange.headers["mcp-name"]].append(exchange.at)
    finally:
        recorder.stop()
    assert len(times) == 4
    for task_times in times.values():
        # How many polls fit in the task's life depends on the machine's load; the spacing must hold regardless.
        assert len(task_times) >= 2
        gaps = [later - earlier for earlier, later in pairwise(task_times)]
        assert min(gaps) >= 0.300 - 0.015, gaps


@pytest.mark.embedded
def test_two_trackers_never_poll_one_task_at_once():
    with DemoServer("--poll-interval-ms", "250", "--get-delay-ms", "100") as demo:
        server = register(demo.url)
        options = {"batch_size": 10, "lease_seconds": 5, "listen": False}
        with RunningTracker(worker_id="a", **options) as first, RunningTracker(worker_id="b", **options) as second:
            # Launched while both run, so that both find due tasks to claim.
            tasks = [task for _ in range(10) for task in launch_live(server, "progress", {"steps": 4}, count=5)]
            wait_until(lambda: all_completed(tasks), timeout=60, what="every task completed")
        counts = stats(demo)
    remote_ids = {t.remote_task_id for t in Task.objects.filter(pk__in=[t.pk for t in tasks])}
    assert set(counts["max_concurrent_polls"]) >= remote_ids
    assert {counts["max_concurrent_polls"][remote] for remote in remote_ids} == {1}
    assert first.tracker.stats.polls > 0 and second.tracker.stats.polls > 0


def test_with_a_subscription_polling_is_only_a_safety_net(demo):
    server = register(demo.url)
    tasks = launch_live(server, "progress", {"steps": 5, "step_ms": 500}, count=3)
    with RunningTracker(worker_id="w1") as running:
        wait_until(lambda: all_completed(tasks), what="every task completed")
    polls = stats(demo)["polls"]
    # Polled at most until the subscription was acknowledged (it would take 8 polls at 300 ms), yet followed
    # completely: every step arrived as a notification and went through apply_snapshot.
    assert all(polls[task.remote_task_id] <= 3 for task in Task.objects.filter(pk__in=[t.pk for t in tasks])), polls
    # Every step the polls did not bring came as a notification (a subscription acknowledged late, on a loaded
    # machine, leaves a step or two to the polls before it).
    assert running.tracker.stats.notifications >= 3 * 4 - running.tracker.stats.polls
    # Once followed, no step is missed. The steps before that are lost (a notification is sent only to subscribers)
    # when the tracker starts late on a loaded machine.
    messages = list(
        ProgressMessage.objects.filter(task_id=tasks[0].pk).order_by("number").values_list("text", flat=True)
    )
    first = int(messages[0].split()[1]) if messages else 0
    assert 2 <= first <= 4, messages
    assert messages == [f"step {n} of 5" for n in range(first, 6)]


# --- leases -----------------------------------------------------------------------------------------------


def test_a_stopped_tracker_releases_its_leases_and_another_takes_over_at_once(demo):
    server = register(demo.url)
    tasks = launch_live(server, "long", {"seconds": 60}, count=5)
    rows = TaskPoll.objects.filter(task__in=tasks)
    running = RunningTracker(worker_id="leaving").start()
    try:
        wait_until(lambda: set(rows.values_list("lease_owner", flat=True)) == {"leaving"}, what="leases taken")
    finally:
        running.stop()
    assert list(rows.values_list("lease_owner", "lease_expires_at").distinct()) == [("", None)]
    assert statuses(tasks) == {TaskStatus.WORKING}
    started = time.monotonic()
    with RunningTracker(worker_id="arriving"):
        wait_until(lambda: set(rows.values_list("lease_owner", flat=True)) == {"arriving"}, what="leases taken over")
    assert time.monotonic() - started < 5


@pytest.mark.embedded
def test_expired_leases_of_a_dead_worker_are_taken_over_and_live_ones_are_left_alone(demo):
    server = register(demo.url)
    orphans = launch_live(server, "progress", {"steps": 2, "step_ms": 200}, count=3)
    [held] = launch_live(server, "progress", {"steps": 2, "step_ms": 200})
    now = timezone.now()
    TaskPoll.objects.filter(task__in=orphans).update(lease_owner="dead", lease_expires_at=now - timedelta(seconds=1))
    TaskPoll.objects.filter(task=held).update(lease_owner="alive", lease_expires_at=now + timedelta(hours=1))
    with RunningTracker(worker_id="w1") as running:
        wait_until(lambda: all_completed(orphans), what="the dead worker's tasks completed")
        claims = running.tracker.stats.claim_statements
        # Three claims more, each of which would have taken the held task if its live lease were ignored.
        wait_until(lambda: running.tracker.stats.claim_statements >= claims + 3, what="three claims more")
    assert statuses([held]) == {TaskStatus.WORKING}
    assert stats(demo)["polls"].get(held.remote_task_id, 0) == 0
    assert TaskPoll.objects.get(task=held).lease_owner == "alive"


def beaten(owner: str, *, seconds_ago: float) -> None:
    at = timezone.now() - timedelta(seconds=seconds_ago)
    WorkerHeartbeat.objects.update_or_create(owner=owner, defaults={"started_at": at, "beat_at": at})


def heartbeat_of(owner: str) -> Heartbeat:
    params = database_params()

    async def connection_params() -> dict:
        return params

    return Heartbeat(owner=owner, connection_params=connection_params)


@pytest.mark.embedded
def test_a_silent_workers_leases_are_released_on_another_workers_next_beat(demo, settings, caplog):
    server = register(demo.url)
    orphans = launch_live(server, "long", {"seconds": 60}, count=3)
    [held] = launch_live(server, "long", {"seconds": 60})
    later = timezone.now() + timedelta(hours=1)
    TaskPoll.objects.filter(task__in=orphans).update(lease_owner="silent", lease_expires_at=later, next_poll_at=later)
    TaskPoll.objects.filter(task=held).update(lease_owner="beating", lease_expires_at=later, next_poll_at=later)
    beaten("silent", seconds_ago=settings.TASKHUB_STALLED_WORKER_SECONDS + 1)
    beaten("beating", seconds_ago=0)
    assert dead_owners(["silent", "beating", "never-beat"]) == {"silent"}
    assert is_alive("beating") and not is_alive("silent") and not is_alive("never-beat")

    survivor = heartbeat_of("survivor")

    async def beat(*steps) -> None:
        try:
            for step in steps:
                await step()
        finally:
            await survivor.aclose()

    asyncio.run(beat(survivor._once))  # only just beating: it judges nobody yet (it may be back from an outage)
    assert TaskPoll.objects.filter(lease_owner="silent").count() == 3
    asyncio.run(beat(survivor.take_over, survivor.take_over))  # the second finds nobody left to take over

    assert set(TaskPoll.objects.filter(task__in=orphans).values_list("lease_owner", "lease_expires_at")) == {("", None)}
    assert not TaskPoll.objects.filter(task__in=orphans, next_poll_at__gt=timezone.now()).exists()  # due at once
    assert TaskPoll.objects.get(task=held).lease_owner == "beating"
    assert WorkerHeartbeat.objects.get(owner="silent").taken_over_at is not None
    [taken] = [r.getMessage() for r in caplog.records if "has not beaten" in r.getMessage()]
    assert taken.startswith("worker survivor: worker silent has not beaten for ") and "its 3 task lease(s)" in taken
    with RunningTracker(worker_id="w1", listen=False):
        wait_until(
            lambda: set(TaskPoll.objects.filter(task__in=orphans).values_list("lease_owner", flat=True)) == {"w1"},
            what="the released leases claimed by a tracker",
        )


@pytest.mark.embedded
def test_a_subscription_moves_with_its_tasks_lease(demo, caplog):
    caplog.set_level("DEBUG", logger="taskhub.worker.tracker")
    server = register(demo.url)
    tasks = launch_live(server, "progress", {"steps": 12, "step_ms": 500}, count=2)
    with RunningTracker(worker_id="first", lease_seconds=3) as first:
        wait_until(lambda: first.tracker.stats.notifications >= 2, what="notifications to the first tracker")
        # The leases move to another worker, due at once (as when the first one is thought dead: worker/heartbeats.py
        # releases its leases with the rows due now, and another worker claims them).
        later = timezone.now() + timedelta(hours=1)
        TaskPoll.objects.filter(task__in=tasks).update(
            lease_owner="second", lease_expires_at=later, next_poll_at=timezone.now()
        )
        with RunningTracker(worker_id="second", lease_seconds=3) as second:
            followed = first.tracker._subscriptions.followed_task_ids
            wait_until(lambda: not followed(), what="the first tracker to stop following the tasks")
            notified = first.tracker.stats.notifications
            subscribing = second.tracker._subscriptions.followed_task_ids
            wait_until(lambda: subscribing(), what="the second tracker to subscribe to the tasks")
            wait_until(lambda: all_completed(tasks), what="every task completed")
        assert first.tracker.stats.notifications == notified, "the first tracker still stores notifications"
    moved = [r for r in caplog.records if "held by another worker now" in r.getMessage()]
    assert moved and all(r.levelname == "INFO" for r in moved)
    # Late notifications about the moved tasks are dropped quietly (a task never followed would be logged at INFO).
    dropped = [r for r in caplog.records if "task notification" in r.getMessage()]
    assert all(r.levelname == "DEBUG" for r in dropped), [(r.levelname, r.getMessage()) for r in dropped]


# --- failures ---------------------------------------------------------------------------------------------


def test_an_unreachable_server_backs_off_without_failing_tasks_and_recovers(tmp_path):
    demo = DemoServer("--poll-interval-ms", "300", "--state", str(tmp_path / "demo.sqlite")).start()
    try:
        server = register(demo.url)
        tasks = launch_live(server, "progress", {"steps": 8, "step_ms": 500}, count=5)
        with RunningTracker(worker_id="w1", **FAST_BACKOFF) as running:
            wait_until(lambda: running.tracker.stats.polls >= 5, what="first polls")
            demo.stop()
            wait_until(lambda: Server.objects.get(pk=server.pk).unreachable_since, what="the server marked unreachable")
            failures_before = running.tracker.stats.failures
            # Two seconds by the tracker's own clock: a claim every 100 ms (IDLE_CLAIM_SECONDS) while it waits.
            claims = running.tracker.stats.claim_statements
            wait_until(lambda: running.tracker.stats.claim_statements >= claims + 20, what="twenty claims more")
            # Backed off: a handful of attempts per task in two seconds, not one per 300 ms.
            assert running.tracker.stats.failures - failures_before <= 5 * 5
            assert statuses(tasks) <= {TaskStatus.WORKING}
            assert max(TaskPoll.objects.filter(task__in=tasks).values_list("consecutive_failures", flat=True)) >= 2
            demo.start()
            wait_until(lambda: all_completed(tasks), what="every task completed after the restart")
    finally:
        demo.stop()
    server.refresh_from_db()
    assert server.unreachable_since is None and "tasks/get" in server.last_error
    server_events = AuditEvent.objects.filter(server_id=server.pk, task=None).values_list("action", flat=True)
    assert list(server_events.order_by("id"))[-2:] == ["server.unreachable", "server.reachable"]


@pytest.mark.embedded
def test_a_disabled_servers_tasks_are_not_polled_and_are_followed_again_once_it_is_enabled(demo):
    server = register(demo.url)
    [task, other] = launch_live(server, "progress", {"steps": 12, "step_ms": 500}, count=2)
    elsewhere = register(demo.url + "?elsewhere")
    [control] = launch_live(elsewhere, "long", {"seconds": 60})

    def polls(task: Task) -> int:
        return stats(demo)["polls"].get(task.remote_task_id, 0)

    with RunningTracker(worker_id="w1", listen=False) as running:
        wait_until(lambda: polls(task) >= 2 and polls(other) >= 2, what="first polls")
        update_server(server=server, user=None, enabled=False)
        # A poll claimed just before may still be under way: it has ended once the control is polled twice more.
        control_polled = polls(control)
        wait_until(lambda: polls(control) >= control_polled + 2, what="two polls more of the enabled server's task")
        polled = (polls(task), polls(other))
        control_polled = polls(control)
        # At the same interval as the control, six polls each of the disabled server's tasks if still followed.
        wait_until(lambda: polls(control) >= control_polled + 6, what="six polls more of the enabled server's task")
        assert (polls(task), polls(other)) == polled
        assert statuses([task, other]) == {TaskStatus.WORKING}
        assert running.error is None

        update_server(server=server, user=None, enabled=True)
        wait_until(lambda: all_completed([task, other]), what="both tasks followed to completion")
    assert polls(task) > polled[0]


def _task_with_remote_id(server: Server, remote_task_id: str, **fields) -> Task:
    task = services.launch(server=with_tools(server, "progress"), tool="progress", arguments={}, user=None)
    wire = {"taskId": remote_task_id, "status": "working", "ttlMs": None, **fields}
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=TaskSnapshot.model_validate(wire)))


def test_a_task_the_server_does_not_know_is_a_protocol_error_then_given_up(demo):
    server = register(demo.url)
    task = _task_with_remote_id(server, "vanished", createdAt=timezone.now().isoformat())
    with RunningTracker(worker_id="w1", **FAST_BACKOFF):
        wait_until(lambda: statuses([task]) == {TaskStatus.EXPIRED}, what="the task given up")
    trail = actions(task)
    assert trail.count("task.protocol_error") == 1  # the same problem is recorded once
    assert trail[-1] == "task.expired"
    problem = AuditEvent.objects.get(task_id=task.pk, action="task.protocol_error").data
    assert problem["error"]["code"] == -32602
    assert not TaskPoll.objects.filter(task=task).exists()


def test_a_task_past_its_ttl_that_the_server_forgot_is_expired_at_once(demo):
    server = register(demo.url)
    task = _task_with_remote_id(server, "long-gone", createdAt="2026-01-01T00:00:00Z", ttlMs=1000)
    with RunningTracker(worker_id="w1"):
        wait_until(lambda: statuses([task]) == {TaskStatus.EXPIRED}, what="the task expired")
    assert "task.protocol_error" not in actions(task)
    assert actions(task)[-1] == "task.expired"


# --- the claim's cost ----------------------------------------------------------------------------------------


def _walked(plan: dict) -> list[dict]:
    """The scans of tasks_taskpoll below the claim's LockRows: the due rows it looked at to choose its batch."""
    if plan["Node Type"] == "LockRows":
        return [node for node in _nodes(plan) if node.get("Relation Name") == "tasks_taskpoll"]
    return [scan for child in plan.get("Plans", ()) for scan in _walked(child)]


def _nodes(plan: dict) -> list[dict]:
    return [plan, *(node for child in plan.get("Plans", ()) for node in _nodes(child))]


def _outline(plan: dict) -> str:
    return "; ".join(
        f"{node['Node Type']} {node.get('Relation Name', '')} rows={node['Actual Rows']}x{node['Actual Loops']}"
        for node in _nodes(plan)
    )


def test_a_claim_looks_at_the_rows_it_takes_not_at_every_due_row():
    """A claim walks the due rows in their order and asks each one's server until its batch is full. Asked as EXISTS,
    Postgres read every task of every enabled server and sorted every due row on each claim, 40-60 ms a batch at
    20,000 tasks (bench/tracker.py: the tracker's Postgres CPU taken from the servers it polls), where its statistics
    made that look cheaper. Here reading by index is made to look dear instead (2,000 rows due, no statistics)."""
    server = create_server(name="peer", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    tasks = Task.objects.bulk_create(
        [Task(server=server, tool="t", status=TaskStatus.WORKING, remote_task_id=f"r{n}") for n in range(2000)]
    )
    TaskPoll.objects.bulk_create([TaskPoll(task=task, next_poll_at=timezone.now()) for task in tasks])

    async def explained_claim() -> dict:
        params = database_params()

        async def connection_params() -> dict:
            return params

        lease, ahead = timedelta(seconds=30), timedelta(seconds=1)
        leases = Leases(
            owner="w1", lease=lease, claim_ahead=ahead, stats=TrackerStats(), connection_params=connection_params
        )
        await leases.connect()
        try:
            await leases.execute("SET random_page_cost = 1000", {})
            claim = {"owner": "w1", "lease": lease, "limit": 10, "ahead": ahead, "stdio_leases": False}
            explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + CLAIM_SQL
            [(explained,)] = await leases.execute(explain, claim, ordered_walk=True)  # as claim() runs it
            # The setting ends with the claim's transaction: the connection's next statements plan as ever.
            assert await leases.execute("SHOW enable_sort", {}) == [("on",)]
        finally:
            await leases.close()
        return explained[0]["Plan"]

    plan = asyncio.run(explained_claim())
    walked = _walked(plan)
    assert walked and all(scan["Node Type"] == "Index Scan" for scan in walked), _outline(plan)
    assert sum(scan["Actual Rows"] * scan["Actual Loops"] for scan in walked) <= 30, _outline(plan)
    assert TaskPoll.objects.filter(lease_owner="w1").count() == 10


# --- a first poll that brings nothing new ------------------------------------------------------------------

CREATED_AT = "2026-11-01T10:00:00Z"
STORED = {"status": "working", "statusMessage": "halfway", "createdAt": CREATED_AT, "ttlMs": None}
STORED["pollIntervalMs"] = 300


def _claim_one() -> Claimed:
    """Claim the due rows exactly as the tracker does (its SQL, on a connection like its own)."""
    with psycopg.connect(autocommit=True, **database_params()) as connection:
        params = {"owner": "w1", "lease": timedelta(seconds=30), "limit": 10, "ahead": timedelta(seconds=1)}
        params["stdio_leases"] = False
        rows = connection.execute(CLAIM_SQL, params).fetchall()
    assert len(rows) == 1, rows
    return Claimed(*rows[0])


@pytest.mark.parametrize(
    ("received", "nothing_new"),
    [
        pytest.param({}, True, id="the same"),
        pytest.param({"lastUpdatedAt": "2026-11-01T10:05:00Z"}, True, id="only lastUpdatedAt moved"),
        pytest.param({"statusMessage": "almost"}, False, id="new status message"),
        pytest.param({"pollIntervalMs": 500}, False, id="new poll interval"),
        pytest.param({"ttlMs": 60_000}, False, id="new ttl"),
        pytest.param({"status": "completed", "result": {"content": []}}, False, id="completed"),
        pytest.param({"status": "input_required", "inputRequests": {}}, False, id="input required"),
    ],
)
def test_a_first_poll_is_stored_only_when_it_says_something_the_row_does_not(received, nothing_new):
    server = create_server(name="peer", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    task = _task_with_remote_id(server, "t-1", **STORED)
    claimed = _claim_one()
    snapshot = TaskSnapshot.model_validate({"taskId": "t-1", "resultType": "complete", **STORED, **received})
    assert claimed.stored_as(snapshot) is nothing_new
    # It agrees with the services: what the tracker skips, apply_snapshot would not have changed.
    assert services.apply_snapshot(task=task, snapshot=snapshot) is not nothing_new


def test_a_task_with_open_input_requests_is_always_stored():
    server = create_server(name="peer", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    asking = {**STORED, "status": "input_required", "inputRequests": {"k": {"method": "elicitation/create"}}}
    task = _task_with_remote_id(server, "t-2", **asking)
    claimed = _claim_one()
    assert claimed.open_requests
    # The server moved on: the open request must be superseded, although no field of the row changes back.
    snapshot = TaskSnapshot.model_validate({"taskId": "t-2", **STORED, "status": "input_required", "inputRequests": {}})
    assert not claimed.stored_as(snapshot)
    assert services.apply_snapshot(task=task, snapshot=snapshot)


class HeldUpClaims:
    """The tracker's Leases on a connection like its own, and a way to hold up its next claim after the claim's
    now() is set (a lock on tasks_task, as a claim of hundreds of rows holds the connection for tens of ms)."""

    def __init__(self) -> None:
        self.params = database_params()
        self.leases = Leases(
            owner="w1",
            lease=timedelta(seconds=30),
            claim_ahead=timedelta(seconds=1),
            stats=TrackerStats(),
            connection_params=self.connection_params,
        )

    async def connection_params(self) -> dict:
        return self.params

    async def __aenter__(self) -> HeldUpClaims:
        await self.leases.connect()
        self.blocker = await psycopg.AsyncConnection.connect(autocommit=True, **self.params)
        # Another connection watches: pg_stat_activity is read once per transaction, and the blocker's lasts.
        self.watcher = await psycopg.AsyncConnection.connect(autocommit=True, **self.params)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.blocker.close()
        await self.watcher.close()
        await self.leases.close()

    async def hold_up_a_claim(self) -> asyncio.Task:
        """Start a claim and return once it waits on the lock (its now() is set)."""
        await self.blocker.execute("BEGIN")
        await self.blocker.execute("LOCK TABLE tasks_task IN ACCESS EXCLUSIVE MODE")
        claiming = asyncio.create_task(self.leases.claim(10))
        while not await self.database_says(
            "SELECT count(*) > 0 FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE %s",
            "%UPDATE tasks_taskpoll AS poll%",
        ):
            await asyncio.sleep(0.02)
        return claiming

    async def let_it_go(self) -> None:
        await self.blocker.execute("COMMIT")

    async def database_says(self, sql: str, *params) -> bool:
        return (await (await self.watcher.execute(sql, params)).fetchone())[0]


def test_a_claim_that_takes_long_hands_its_rows_over_with_the_time_it_took_already_gone():
    """A row's due_in counts from the claim's now(), when the statement was sent: a claim held up on its way
    back (here by a lock, usually by hundreds of rows) must not push every poll of its batch that much later."""
    server = create_server(name="peer", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    task = _task_with_remote_id(server, "t-slow", **STORED)
    TaskPoll.objects.filter(task=task).update(next_poll_at=timezone.now() + timedelta(seconds=0.3))
    due_at = TaskPoll.objects.get(task=task).next_poll_at

    async def claim_held_up_until_the_row_is_due() -> list[Claimed]:
        async with HeldUpClaims() as held:
            claiming = await held.hold_up_a_claim()
            while not await held.database_says("SELECT clock_timestamp() > %s", due_at):
                await asyncio.sleep(0.02)
            await held.let_it_go()
            return await claiming

    claimed = asyncio.run(claim_held_up_until_the_row_is_due())
    assert [row.task_id for row in claimed] == [task.pk]
    assert claimed[0].due_in == 0.0, f"handed over as due in {claimed[0].due_in:.3f}s, its time already passed"


def test_a_reschedule_written_late_counts_its_delay_from_the_answer_not_from_the_write():
    """A reschedule's delay counts down from the answer to the moment its statement is sent: a flush that waits
    for the connection (a claim holds it) must not add that wait to the row's time."""
    server = create_server(name="peer", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    task = _task_with_remote_id(server, "t-late-write", **STORED)

    async def reschedule_behind_a_held_up_claim() -> bool:
        async with HeldUpClaims() as held:
            [claimed] = await held.leases.claim(10)
            claiming = await held.hold_up_a_claim()
            held.leases.reschedule(claimed, delay_ms=300, failures=0)
            due = time.monotonic() + 0.3
            flushing = asyncio.create_task(held.leases.flush())
            while time.monotonic() < due:  # the row's time passes while the flush waits for the connection
                await asyncio.sleep(0.02)
            await held.let_it_go()
            assert await claiming == []
            await flushing
            return await held.database_says(
                "SELECT next_poll_at <= now() FROM tasks_taskpoll WHERE task_id = %s", task.pk
            )

    assert asyncio.run(reschedule_behind_a_held_up_claim()), "the row's time was pushed back by the write's wait"


@pytest.mark.embedded
def test_rows_are_claimed_ahead_and_polled_at_their_time_not_before(demo):
    recorder = WireRecorder(demo.url).start()
    try:
        server = register(recorder.url)
        task = _task_with_remote_id(server, "ahead", createdAt=timezone.now().isoformat())
        due_at = time.monotonic() + 0.6
        TaskPoll.objects.filter(task=task).update(next_poll_at=timezone.now() + timedelta(seconds=0.6))
        with RunningTracker(worker_id="w1", listen=False, claim_ahead_seconds=0.5) as running:
            wait_until(lambda: running.tracker.stats.polls >= 1, what="the first poll")
        first = recorder.requests("tasks/get")[0]
    finally:
        recorder.stop()
    assert first.at >= due_at - 0.01, f"polled {due_at - first.at:.3f}s before its time"
