"""Issue 13 item 1 across real processes: the demo server over stdio WITHOUT `--state` (its tasks live in its
process only), `manage.py worker` subprocesses, Postgres.

One process per stdio server, in the worker holding its lease: discovery, launch, answers, cancels and polls all
reach that process, so a task it created is followed to its end. Two workers: the server runs in one of them;
after `kill -9` of that worker the other takes the server over within the lease time, and each task is followed
to its end or ends `lost` with the message, none left working.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from procrastinate import tasks
from procrastinate.contrib.django.models import ProcrastinateJob

from taskhub.accounts.groups import ADMINS
from taskhub.audit.models import AuditEvent
from taskhub.servers.hooks import DISCOVERY_JOB, jobs_in_django_transaction
from taskhub.servers.models import ProcessState, Server, ServerProcess
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import LIVE_STATUSES, InputRequest, InputRequestState, Task, TaskStatus
from tests.account_fixtures import make_user
from tests.demo_process import stdio_target
from tests.helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

APPROVE = {"action": "accept", "content": {"approved": True, "reason": "ok"}}


@pytest.fixture
def operator():
    return get_user_model().objects.create_user(username="olga", password="x")


def add_through_the_page(client) -> Server:
    """The admin's add-server form, for the demo server over stdio without --state (its tasks live in its process)."""
    target = stdio_target("--poll-interval-ms", "200")
    form = {
        "name": "demo over stdio",
        "transport": "stdio",
        "url": "",
        "command": target.command,
        "args": "\n".join(target.args),
        "enabled": "on",
        "bearer_token": "",
        "headers": "",
        "env": "\n".join(f"{name}={value}" for name, value in (target.env or {}).items()),
    }
    response = client.post(reverse("servers:add"), form)
    assert response.status_code == 302, response.content.decode()[:2000]
    server = Server.objects.get(name="demo over stdio")
    detail = client.get(response["Location"]).content.decode()
    assert "Discovering…" in detail and "Not running" in detail
    (job,) = ProcrastinateJob.objects.filter(task_name=DISCOVERY_JOB, args__server_id=server.pk)
    assert job.queue_name == f"stdio-{server.pk}"  # run only where the server's process is
    return server


def owner_of(server: Server) -> str:
    process = ServerProcess.objects.filter(pk=server.pk).first()
    return process.lease_owner if process is not None and process.state == ProcessState.RUNNING else ""


def status(task: Task) -> str:
    return Task.objects.get(pk=task.pk).status


def open_request(task: Task) -> InputRequest | None:
    return InputRequest.objects.filter(task=task, state=InputRequestState.OPEN).first()


def test_tasks_on_a_stdio_server_reach_their_end_and_survive_a_killed_owner(workers, operator, client):
    client.force_login(make_user("root", ADMINS))
    server = add_through_the_page(client)  # the page comes back at once; no worker runs yet
    workers.start("stdio-a")
    workers.start("stdio-b")
    wait_until(
        lambda: Server.objects.get(pk=server.pk).discovered_at is not None, timeout=60, what="the tools discovered"
    )
    discovered = client.get(reverse("servers:discovery", args=[server.pk])).content.decode()
    assert "Discovered demo over stdio" in discovered
    server.refresh_from_db()
    assert {tool["name"] for tool in server.tools} >= {"approval", "long", "fail", "tool_error"}

    # Every operation goes through the one process: an approval answered, a cancel, a failure.
    approval = services.launch(server=server, tool="approval", arguments={"action": "deploy"}, user=operator)
    request = wait_until(lambda: open_request(approval), timeout=30, what="the approval request")
    services.answer_input(input_request=request, response=APPROVE, user=operator)
    wait_until(lambda: status(approval) == TaskStatus.COMPLETED, timeout=30, what="the approval completed")
    assert Task.objects.get(pk=approval.pk).result["content"][0]["text"] == "approved: deploy (reason: ok)"

    long = services.launch(server=server, tool="long", arguments={"seconds": 60}, user=operator)
    wait_until(lambda: status(long) == TaskStatus.WORKING, timeout=30, what="the long task working")
    services.request_cancel(task=long, user=operator)
    wait_until(lambda: status(long) == TaskStatus.CANCELLED, timeout=30, what="the long task cancelled")

    # The owner dies with tasks live on its process: the other worker takes the server over.
    first_owner = wait_until(lambda: owner_of(server), timeout=30, what="the server's process running")
    first_pid = ServerProcess.objects.get(pk=server.pk).pid
    live = [
        services.launch(server=server, tool="long", arguments={"seconds": 120}, user=operator),
        services.launch(server=server, tool="approval", arguments={"action": "wait"}, user=operator),
    ]
    wait_until(
        lambda: all(status(task) in LIVE_STATUSES for task in live), timeout=30, what="the tasks live on the process"
    )
    workers.processes[first_owner].send_signal(signal.SIGKILL)
    workers.processes[first_owner].wait(10)

    second_owner = wait_until(
        lambda: (owner := owner_of(server)) != first_owner and owner, timeout=30, what="the other worker taking over"
    )
    assert ServerProcess.objects.get(pk=server.pk).pid != first_pid
    for task in live:
        wait_until(lambda task=task: status(task) == TaskStatus.LOST, timeout=60, what="the task marked lost")
        task = Task.objects.get(pk=task.pk)
        assert task.status_message == "the server process that held this task exited"
        assert AuditEvent.objects.filter(task_id=task.pk, action="task.lost").count() == 1
    assert not InputRequest.objects.filter(task__in=live, state=InputRequestState.OPEN).exists()

    # The new owner's process follows new tasks to their end.
    after = services.launch(server=server, tool="approval", arguments={"action": "again"}, user=operator)
    request = wait_until(lambda: open_request(after), timeout=30, what="the approval request on the new process")
    services.answer_input(input_request=request, response=APPROVE, user=operator)
    wait_until(lambda: status(after) == TaskStatus.COMPLETED, timeout=30, what="completion on the new process")
    assert owner_of(server) == second_owner
    assert not Task.objects.filter(server=server, status__in=LIVE_STATUSES).exists()


SERVER_SCRIPT = str(Path(__file__).with_name("hostile_stdio_server.py"))
SECRET = "stdio-secret-8c2d-never-on-the-page"


def test_an_exited_process_is_started_again_and_its_page_shows_it(workers, operator, client):
    admin = make_user("root", ADMINS)
    server = create_server(
        name="careless stdio server",
        transport="stdio",
        command=sys.executable,
        args=[SERVER_SCRIPT],
        env={"API_TOKEN": SECRET, "HOSTILE_PRINT_ENV": "1", "HOSTILE_PRINT_NUL": "1"},
        user=operator,
    )
    broken = create_server(name="no such program", transport="stdio", command="/nonexistent/mcp-server", user=operator)
    workers.start("stdio-solo")
    process = wait_until(
        lambda: ServerProcess.objects.filter(pk=server.pk, state=ProcessState.RUNNING).exclude(stderr_tail=[]).first(),
        timeout=30,
        what="the process running, its stderr stored",
    )
    assert process.lease_owner == "stdio-solo" and process.pid and process.restarts == 0
    process = wait_until(
        lambda: ServerProcess.objects.filter(pk=server.pk, stderr_tail__contains=["a nul\ufffdon stderr"]).first(),
        timeout=30,
        what="both stderr lines stored, the NUL (which Postgres cannot store) replaced",
    )
    assert any("debug: starting with" in line for line in process.stderr_tail)
    assert SECRET not in json.dumps(process.stderr_tail) and "[redacted]" in json.dumps(process.stderr_tail)

    os.kill(process.pid, signal.SIGKILL)
    again = wait_until(
        lambda: ServerProcess.objects.filter(pk=server.pk, state=ProcessState.RUNNING, restarts=1).first(),
        timeout=30,
        what="the process started again",
    )
    assert again.pid != process.pid
    assert again.last_exit == "killed by SIGKILL"

    client.force_login(admin)
    page = client.get(f"/servers/{server.pk}/").content.decode()
    fragment = client.get(f"/servers/{server.pk}/process/").content.decode()
    for html in (page, fragment):
        assert f"<code>{again.pid}</code>" in html
        assert "killed by SIGKILL" in html
        assert "debug: starting with" in html and "[redacted]" in html
        assert SECRET not in html

    # A program that cannot even be started is tried again, with a growing pause, and says why on its page.
    failing = wait_until(
        lambda: ServerProcess.objects.filter(pk=broken.pk, restarts__gte=2, state=ProcessState.RESTARTING).first(),
        timeout=30,
        what="the program tried again",
    )
    assert failing.pid is None
    assert "could not be started" in failing.last_exit and "nonexistent" in failing.last_exit
    assert "could not be started" in client.get(f"/servers/{broken.pk}/").content.decode()
    assert "process could not be started" in client.get("/servers/").content.decode()

    # Made an HTTP server while its worker holds it: its process is stopped, and a job left in its queue (here one
    # due in an hour) goes to the default queue, where workers run it.
    later = tasks.configure_task(
        name=DISCOVERY_JOB,
        job_manager=jobs_in_django_transaction(),
        queue=f"stdio-{broken.pk}",
        schedule_in={"hours": 1},
    ).defer(server_id=broken.pk, requested_by=None)
    Server.objects.filter(pk=broken.pk).update(transport="http", url="http://127.0.0.1:9/mcp", command="")
    wait_until(lambda: ProcrastinateJob.objects.get(pk=later).queue_name == "default", timeout=30, what="the job moved")
    assert ServerProcess.objects.get(pk=broken.pk).lease_owner == ""
