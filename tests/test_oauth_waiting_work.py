"""Work waits while a server needs re-authorization (issue 33 item 3): a worker finds the server's refresh token
revoked; the launch and the answer for that server then wait (not failed, not sent) and go out once, each exactly
once, after an admin connects the server again. A real worker process, the demo MCP server behind the test
authorization server, and the admin's Connect through the web views (tests/test_oauth_connect.py's halves)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.audit.models import AuditEvent
from taskhub.servers.models import Server, ServerAuthorization
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskStatus
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.helpers import let_time_pass, wait_until
from tests.oauth_server import protecting
from tests.stack_fixtures import demo_stats
from tests.test_oauth_connect import approve, start_connect
from tests.test_oauth_fresh_tokens import CLIENT_ID, connected

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

APPROVE = {"action": "accept", "content": {"approved": True, "reason": "ok"}}


@pytest.fixture
def demo():
    with DemoServer("--poll-interval-ms", "200") as server:
        yield server


@pytest.fixture
def protected_demo(demo):
    with protecting(demo.url) as server:
        yield server


def connect_again(admin, server: Server) -> None:
    """The admin connects the server again in the browser (the test client, and the authorization server's redirect
    that approves by itself)."""
    browser = Client()
    browser.force_login(admin)
    answer = approve(start_connect(browser, Server.objects.get(pk=server.pk)))
    assert browser.get(reverse("servers:oauth_callback"), answer).status_code == 302


def test_a_launch_and_an_answer_wait_for_the_admin_and_go_out_once(demo, protected_demo, workers):
    admin = make_user("alex", ADMINS)
    approver = make_user("april", APPROVERS, ADMINS)
    server, _, _ = connected(protected_demo, expires_in_s=3600)
    server = with_tools(server, "approval", "progress")
    workers.start("patient")

    asking = services.launch(server=server, tool="approval", arguments={"action": "deploy"}, user=approver)
    request = wait_until(
        lambda: InputRequest.objects.filter(task=asking, state=InputRequestState.OPEN).first(),
        timeout=60,
        what="the approval request",
    )
    remote_task_id = Task.objects.get(pk=asking.pk).remote_task_id

    # The authorization server revokes everything; the next call the worker makes finds out.
    protected_demo.provider.revoke_all()
    waiting_launch = services.launch(
        server=server, tool="progress", arguments={"steps": 1, "step_ms": 100}, user=approver
    )
    wait_until(
        lambda: ServerAuthorization.objects.get(server=server).needs_reauthorization_since is not None,
        timeout=30,
        what="the server marked as needing re-authorization",
    )
    services.answer_input(input_request=request, response=APPROVE, user=approver)
    let_time_pass(4, because="several of the jobs' looks (every second here) must send nothing while it waits")
    assert Task.objects.get(pk=waiting_launch.pk).status == TaskStatus.LAUNCHING
    assert InputRequest.objects.get(pk=request.pk).state == InputRequestState.ANSWERED
    stats = demo_stats(demo)
    assert stats["calls"].get("progress", 0) == 0
    assert not stats["deliveries"]

    # The admin connects it again, in the browser (here: the test client and the authorization server's redirect).
    connect_again(admin, server)

    wait_until(
        lambda: Task.objects.get(pk=waiting_launch.pk).status != TaskStatus.LAUNCHING,
        timeout=30,
        what="the waiting launch to go out",
    )
    wait_until(
        lambda: InputRequest.objects.get(pk=request.pk).state == InputRequestState.DELIVERED,
        timeout=30,
        what="the waiting answer to be delivered",
    )
    wait_until(
        lambda: Task.objects.get(pk=waiting_launch.pk).status == TaskStatus.COMPLETED,
        timeout=30,
        what="the launched task to complete (followed with the new token)",
    )
    let_time_pass(2, because="anything sent twice would arrive meanwhile")
    stats = demo_stats(demo)
    assert stats["calls"]["progress"] == 1
    assert stats["deliveries"] == {f"{remote_task_id}/{request.key}": 1}


def test_a_tool_call_refused_unrun_for_want_of_scope_waits_for_the_admin_and_goes_out_once(
    demo, protected_demo, workers
):
    """Step-up after the launch was marked sent (issue 33 item 4): discovery passes, then the server answers the
    tools/call itself 403 insufficient_scope. A 403 proves it did not run the call, so the launch is not "outcome
    unknown": its sent marker is withdrawn (an audit row of its own), it waits like a launch not sent yet, and it goes
    out once, with the wider scope, after the admin connects the server again."""
    admin = make_user("alex", ADMINS)
    server, _, _ = connected(protected_demo, expires_in_s=3600)
    server = with_tools(server, "progress")
    protected_demo.provider.clients[CLIENT_ID].scope = "admin"  # what the authorization server would grant
    protected_demo.scope_for_method["tools/call"] = "admin"
    workers.start("patient")

    launch = services.launch(server=server, tool="progress", arguments={"steps": 1, "step_ms": 100}, user=admin)
    wait_until(
        lambda: AuditEvent.objects.filter(task=launch, action="task.launch_withdrawn").exists(),
        timeout=30,
        what="the refused call's sent marker withdrawn",
    )
    authorization = ServerAuthorization.objects.get(server=server)
    assert authorization.needs_reauthorization_since is not None and authorization.wanted_scope == "admin"
    let_time_pass(3, because="the launch job's looks (every second here) must send nothing while it waits")
    waiting = Task.objects.get(pk=launch.pk)
    assert waiting.status == TaskStatus.LAUNCHING and "connect the server again" in waiting.status_message
    assert demo_stats(demo)["calls"].get("progress", 0) == 0

    connect_again(admin, server)
    wait_until(
        lambda: Task.objects.get(pk=launch.pk).status == TaskStatus.COMPLETED,
        timeout=30,
        what="the launch to go out with the wider scope and complete",
    )
    let_time_pass(2, because="a call sent twice would arrive meanwhile")
    assert demo_stats(demo)["calls"]["progress"] == 1
    marks = AuditEvent.objects.filter(task=launch, action__startswith="task.launch_").order_by("id")
    assert [event.action for event in marks] == [
        "task.launch_sent",
        "task.launch_withdrawn",
        "task.launch_sent",
        "task.launch_answered",
    ]


def test_an_answer_refused_unrun_for_want_of_scope_waits_for_the_admin_and_is_delivered_once(
    demo, protected_demo, workers
):
    """The same for an answer: its `tasks/update` is refused 403 insufficient_scope after the delivery was claimed.
    The server did not take it, so it waits for the admin's Connect and is delivered once after it."""
    admin = make_user("alex", ADMINS, APPROVERS)
    server, _, _ = connected(protected_demo, expires_in_s=3600)
    server = with_tools(server, "approval")
    protected_demo.provider.clients[CLIENT_ID].scope = "admin"
    workers.start("patient")
    asking = services.launch(server=server, tool="approval", arguments={"action": "deploy"}, user=admin)
    request = wait_until(
        lambda: InputRequest.objects.filter(task=asking, state=InputRequestState.OPEN).first(),
        timeout=60,
        what="the approval request",
    )
    remote_task_id = Task.objects.get(pk=asking.pk).remote_task_id

    protected_demo.scope_for_method["tasks/update"] = "admin"
    services.answer_input(input_request=request, response=APPROVE, user=admin)
    wait_until(
        lambda: ServerAuthorization.objects.get(server=server).needs_reauthorization_since is not None,
        timeout=30,
        what="the refused answer to mark the server",
    )
    let_time_pass(3, because="the delivery's looks (every second here) must deliver nothing while it waits")
    assert InputRequest.objects.get(pk=request.pk).state == InputRequestState.ANSWERED
    assert not demo_stats(demo)["deliveries"]

    connect_again(admin, server)
    wait_until(
        lambda: InputRequest.objects.get(pk=request.pk).state == InputRequestState.DELIVERED,
        timeout=60,
        what="the answer delivered after the Connect",
    )
    let_time_pass(2, because="an answer sent twice would arrive meanwhile")
    assert demo_stats(demo)["deliveries"] == {f"{remote_task_id}/{request.key}": 1}
