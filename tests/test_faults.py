"""Faults across real processes (issue 7): Postgres restarted under running workers, Redis stopped under the
web process and a worker, SIGTERM to a worker while it delivers an answer.

Postgres and Redis here are the test's own (tests/own_services.py), on free ports, never the shared ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.backends.postgresql.base import DatabaseWrapper

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.servers.discovery import discover_and_record
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from taskhub.worker.models import WorkerHeartbeat
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import running_daphne
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.helpers import wait_until
from tests.own_services import DATABASE_NAME, OwnPostgres, own_postgres, own_redis
from tests.stack_fixtures import (
    SignedIn,
    Workers,
    demo_stats,
    frames_until,
    register_and_discover,
    running_counts,
    session_cookie_for,
    statuses,
    went_up_and_down,
    worker_environment,
    worker_log,
)

pytestmark = pytest.mark.slow

APPROVE = {"action": "accept", "content": {"approved": True, "reason": "ok"}}


@contextlib.contextmanager
def orm_on(postgres: OwnPostgres, django_db_blocker) -> Iterator[None]:
    """This process's ORM on `postgres` (migrated) instead of the test database, for one test."""
    original = connections["default"]
    settings = {
        **original.settings_dict,
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DATABASE_NAME,
        "HOST": "127.0.0.1",
        "PORT": postgres.port,
        "USER": "postgres",
        "PASSWORD": "",
        "CONN_MAX_AGE": 0,
    }
    with django_db_blocker.unblock():
        connections["default"] = DatabaseWrapper(settings, "default")
        try:
            call_command("migrate", verbosity=0)
            yield
        finally:
            connections["default"].close()
            connections["default"] = original


@pytest.fixture
def fault_postgres(django_db_blocker) -> Iterator[OwnPostgres]:
    with own_postgres() as postgres, orm_on(postgres, django_db_blocker):
        yield postgres


def open_requests(tasks: list[Task]) -> list[InputRequest]:
    return list(InputRequest.objects.filter(task__in=tasks, state=InputRequestState.OPEN))


def assert_still_running(workers: Workers) -> None:
    exited = {name: process.returncode for name, process in workers.processes.items() if process.poll() is not None}
    assert not exited, f"worker(s) exited: {exited}"


def test_workers_reconnect_after_postgres_restarts_and_lose_nothing(fault_postgres):
    admin = make_user("ada", ADMINS)
    operator = make_user("olga", OPERATORS)
    approver = make_user("april", APPROVERS)
    with DemoServer("--poll-interval-ms", "300") as demo:
        server = create_server(name="demo", transport="http", url=demo.url, user=admin)
        discover_and_record(server=server, user=admin)

        def launch_batch(label: str) -> tuple[list[Task], list[Task]]:
            progress = [
                services.launch(server=server, tool="progress", arguments={"steps": 6, "step_ms": 1000}, user=operator)
                for _ in range(4)
            ]
            approvals = [
                services.launch(server=server, tool="approval", arguments={"action": f"{label} {n}"}, user=operator)
                for n in range(3)
            ]
            return progress, approvals

        before_progress, before_approvals = launch_batch("before")
        workers = Workers(worker_environment())
        try:
            workers.start("pg-alpha")
            workers.start("pg-beta")
            wait_until(lambda: statuses(before_progress).get("working") == 4, timeout=60, what="4 working tasks")
            wait_until(lambda: len(open_requests(before_approvals)) == 3, timeout=60, what="3 open requests")
            # Both are running (one alone can do the work above; the other may still be starting on a loaded machine).
            wait_until(
                lambda: WorkerHeartbeat.objects.filter(owner__in=["pg-alpha", "pg-beta"]).count() == 2,
                timeout=60,
                what="both workers beating",
            )
            # Answer one now, so that its delivery may be in flight when the database goes away.
            services.answer_input(input_request=open_requests(before_approvals)[0], response=APPROVE, user=approver)

            fault_postgres.stop()
            # A worker started while the database is gone waits for it instead of exiting.
            workers.start("pg-late")
            for name in ("pg-alpha", "pg-beta"):
                log = worker_log(name)
                wait_until(
                    lambda log=log: "heartbeat failed" in log.read_text(),
                    timeout=60,
                    what=f"{name}'s work to fail against a database that is gone",
                )
            wait_until(
                lambda: "waiting for the database" in worker_log("pg-late").read_text(),
                timeout=60,
                what="pg-late to wait for the database",
            )
            fault_postgres.start()
            connections["default"].close()  # this test's own connection died with the server too

            assert_still_running(workers)
            for request in open_requests(before_approvals):
                services.answer_input(input_request=request, response=APPROVE, user=approver)
            after_progress, after_approvals = launch_batch("after")
            wait_until(lambda: len(open_requests(after_approvals)) == 3, timeout=60, what="3 requests after")
            for request in open_requests(after_approvals):
                services.answer_input(input_request=request, response=APPROVE, user=approver)

            every_task = before_progress + before_approvals + after_progress + after_approvals
            wait_until(
                lambda: statuses(every_task).get("completed") == len(every_task),
                timeout=120,
                interval=0.5,
                what=f"all {len(every_task)} tasks completed; now {statuses(every_task)}",
            )
            # An answer whose acknowledgement could not be recorded (the database was gone) is confirmed by
            # tasks/get once its attempt has settled.
            wait_until(
                lambda: not InputRequest.objects.filter(state=InputRequestState.ANSWERED).exists(),
                timeout=120,
                what="every delivery recorded",
            )
            assert_still_running(workers)
            wait_until(
                lambda: WorkerHeartbeat.objects.filter(owner="pg-late").exists(), timeout=60, what="pg-late beating"
            )
            stats = demo_stats(demo)
        finally:
            workers.stop_all()

    assert Task.objects.count() == len(every_task) == 14
    approvals = Task.objects.filter(pk__in=[t.pk for t in before_approvals + after_approvals])
    assert sorted(stats["deliveries"].get(f"{t.remote_task_id}/approve", 0) for t in approvals) == [1] * 6
    assert InputRequest.objects.filter(state=InputRequestState.DELIVERED).count() == 6
    for task in every_task:
        trail = list(AuditEvent.objects.filter(task_id=task.pk).order_by("id"))
        actions = [event.action for event in trail]
        assert actions.count("task.launched") == 1, actions
        assert [e.data["to"] for e in trail if e.action == "task.status_changed"][-1] == "completed", actions
        if task in before_approvals + after_approvals:
            assert actions.count("input.answered") == actions.count("input.delivered") == 1, actions


# --- SIGTERM to a worker while it delivers an answer ---------------------------------------------------------


def answer_in_flight(demo: DemoServer, workers: Workers, *worker_options: str, names=("courier",)) -> Task:
    """An approval answered, and its tasks/update sent by one of the workers and now held by the (slow) server."""
    approver = make_user("april", APPROVERS)
    server = create_server(name="demo", transport="http", url=demo.url, user=make_user("ada", ADMINS))
    task = services.launch(
        server=with_tools(server, "approval"), tool="approval", arguments={"action": "deploy"}, user=approver
    )
    for name in names:
        workers.start(name, *worker_options)
    request = wait_until(lambda: open_requests([task]), timeout=60, what="the approval request")[0]
    services.answer_input(input_request=request, response=APPROVE, user=approver)
    wait_until(
        lambda: InputRequest.objects.filter(pk=request.pk, delivery_attempted_at__isnull=False).exists(),
        timeout=30,
        what="the delivery to start",
    )
    remote_task_id = Task.objects.get(pk=task.pk).remote_task_id
    # Then the request reaches the server, which holds it for a few seconds (on a loaded machine it can take longer
    # than any fixed pause between the attempt being recorded and the request arriving).
    wait_until(
        lambda: demo_stats(demo)["updates_received"].get(remote_task_id), timeout=30, what="the server to hold it"
    )
    return task


def delivering_worker(workers: Workers) -> str:
    """The name of the worker that sent the answer (it says so in its log)."""
    for name in workers.processes:
        if "sending the answer" in worker_log(name).read_text():
            return name
    raise AssertionError("no worker says it is sending the answer")


def assert_delivered_once(demo: DemoServer, task: Task) -> None:
    wait_until(
        lambda: not InputRequest.objects.filter(task=task, state=InputRequestState.ANSWERED).exists(),
        timeout=120,
        what="the delivery job to finish",
    )
    task.refresh_from_db()
    assert task.status == "completed", task.status
    assert demo_stats(demo)["deliveries"] == {f"{task.remote_task_id}/approve": 1}
    request = InputRequest.objects.get(task=task)
    assert request.state == InputRequestState.DELIVERED
    actions = list(AuditEvent.objects.filter(task_id=task.pk).values_list("action", flat=True))
    assert actions.count("input.answered") == actions.count("input.delivered") == 1, actions


@pytest.mark.django_db(transaction=True)
def test_sigterm_mid_delivery_lets_the_worker_finish_it_before_it_exits(workers):
    with DemoServer("--poll-interval-ms", "200", "--update-delay-ms", "3000") as demo:
        task = answer_in_flight(demo, workers)
        courier = workers.processes["courier"]
        courier.send_signal(signal.SIGTERM)
        assert courier.wait(timeout=40) == 0
        # It recorded the server's acknowledgement on its way out.
        assert InputRequest.objects.get(task=task).state == InputRequestState.DELIVERED
        workers.start("successor")
        wait_until(lambda: Task.objects.get(pk=task.pk).is_terminal, timeout=60, what="the task to end")
        assert_delivered_once(demo, task)


@pytest.mark.django_db(transaction=True)
def test_a_worker_stopped_before_its_delivery_ends_leaves_it_to_another_that_does_not_resend(workers):
    # The server holds the answer longer than the worker may take to stop, and applies it all the same.
    with DemoServer("--poll-interval-ms", "200", "--update-delay-ms", "6000") as demo:
        task = answer_in_flight(demo, workers, "--shutdown-timeout", "0.5", names=("east", "west"))
        doomed = workers.processes[delivering_worker(workers)]
        doomed.send_signal(signal.SIGTERM)
        assert doomed.wait(timeout=40) == 0
        # Cut off before the acknowledgement: the job is retried by the other worker while the answer is held.
        assert InputRequest.objects.get(task=task).state == InputRequestState.ANSWERED
        wait_until(lambda: Task.objects.get(pk=task.pk).is_terminal, timeout=120, what="the task to end")
        assert_delivered_once(demo, task)
    delivered = AuditEvent.objects.get(task_id=task.pk, action="input.delivered")
    # By the tracker's next poll, or by the retried job's own tasks/get once the attempt has settled.
    assert delivered.data["confirmed_by"] in {
        "tasks/get: the server no longer asks for the key",
        "tasks/get after an interrupted delivery",
    }


# --- Redis stopped under the web process and a worker --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_with_redis_stopped_pages_work_nothing_is_lost_and_live_updates_resume_after(production_password_hashers):
    admin = make_user("ada", ADMINS)
    olga = make_user("olga", OPERATORS, APPROVERS, password=TEST_PASSWORD)
    with own_redis() as redis, DemoServer("--poll-interval-ms", "200") as demo:
        env = {"REDIS_URL": redis.url, "REDIS_CHANNEL_PREFIX": "taskhub-faults"}
        server = register_and_discover(demo, admin)
        workers = Workers(worker_environment(**env))
        try:
            workers.start("unflustered")
            with running_daphne(**env) as web, ThreadPoolExecutor(max_workers=1) as socket_thread:
                socket_url = web.url.replace("http://", "ws://") + "/ws/live/"
                cookie = session_cookie_for(olga)
                # A page open through the outage: its socket must end (the page reconnects) or resume, never hang.
                connected = threading.Event()

                def connected_then_up_and_down(frames: list[str]) -> bool:
                    connected.set()  # the consumer sends the nav counts once it has joined its groups
                    return went_up_and_down(frames)

                through = socket_thread.submit(
                    asyncio.run, frames_until(socket_url, cookie, connected_then_up_and_down, timeout=150)
                )
                assert connected.wait(timeout=30), "the live socket did not connect"
                redis.stop()

                # Signing in counts failures in the cache: it must not need Redis.
                olga_pages = SignedIn(web.url, "olga", TEST_PASSWORD)
                launched = olga_pages.post(
                    f"/launch/{server.pk}/approval/", {"mode": "json", "arguments_json": '{"action": "ship"}'}
                )
                assert launched.status == 200 and "/tasks/" in launched.url, launched.url
                task = Task.objects.get()
                request = wait_until(lambda: open_requests([task]), timeout=60, what="the approval request")[0]
                # Served from the database alone (an error status would raise here).
                assert "approval" in olga_pages.get("/tasks/")
                assert "ship" in olga_pages.get(f"/tasks/{task.pk}/")
                assert "Approve ship?" in olga_pages.get("/inbox/")
                answered = olga_pages.post(f"/inbox/{request.pk}/answer", {"action": "decline"})
                assert answered.status == 200
                wait_until(lambda: Task.objects.get(pk=task.pk).is_terminal, timeout=60, what="the task to end")

                task.refresh_from_db()
                assert task.status == "completed" and task.result["content"][0]["text"].startswith("declined")
                assert demo_stats(demo)["deliveries"] == {f"{task.remote_task_id}/approve": 1}
                actions = list(AuditEvent.objects.filter(task_id=task.pk).values_list("action", flat=True))
                for expected in ("task.launched", "task.input_requested", "input.answered", "input.delivered"):
                    assert actions.count(expected) == 1, actions
                assert_still_running(workers)
                assert web.process.poll() is None
                assert f"live update for task {task.pk} dropped" in worker_log("unflustered").read_text()

                redis.start()

                async def watch_a_task_run() -> list[str]:
                    joined = asyncio.Event()

                    def joined_then_up_and_down(frames: list[str]) -> bool:
                        joined.set()  # the consumer sends the nav counts once it has joined its groups
                        return went_up_and_down(frames)

                    listening = asyncio.create_task(
                        frames_until(socket_url, cookie, joined_then_up_and_down, timeout=30)
                    )
                    await asyncio.wait_for(joined.wait(), timeout=30)
                    await asyncio.to_thread(
                        services.launch, server=server, tool="progress", arguments={"steps": 2}, user=olga
                    )
                    return await listening

                frames = asyncio.run(watch_a_task_run())
                assert went_up_and_down(frames), running_counts(frames)
                through.result(timeout=30)  # closed during the outage (returned then), or saw the last run too
        finally:
            workers.stop_all()
