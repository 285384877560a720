"""An approver's answer the web process sends itself (taskhub/gateway/sending.py: answer_and_send): claimed in the
answer's transaction, sent as it commits on the gateway's kept client, recorded by the delivery services; the sweep
hands it to the delivery job should the process stop; nothing sent when the server is found gone or the claim grew old
(the job sends it at once); a refusal recorded; and where it cannot, the delivery job sends it as before."""

from __future__ import annotations

import datetime

import pytest
from django.contrib.auth.models import Group
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.gateway import sending
from taskhub.gateway.sending import Sender, answer_and_send
from taskhub.gateway.waiting import close_gateway_connections
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskPoll, TaskStatus
from taskhub.tasks.services.delivering import WEB_SEND_MARGIN_SECONDS
from taskhub.worker import heartbeats, jobs, sweeps
from tests.account_fixtures import make_user
from tests.approval_fixtures import add_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.demo_process import DemoServer
from tests.helpers import wait_until
from tests.test_gateway import rpc
from tests.wire_recorder import WireRecorder
from tests.worker_jobs.job_helpers import APPROVE_ANSWER, approval_waiting, demo_stats, follow, jobs_of, run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_job_queue")]

DELIVERY_JOB = "taskhub.deliver_answer"


@pytest.fixture
def sender(monkeypatch):
    sender = Sender()
    monkeypatch.setattr(sending, "SENDER", sender)
    yield sender
    sender.close()
    close_gateway_connections()  # the recording threads' connections, or the test database could not be dropped


def approval_request(server, operator) -> InputRequest:
    task = approval_waiting(server, operator)
    TaskPoll.objects.filter(task=task).update(next_poll_at=timezone.now() + datetime.timedelta(hours=1))
    return InputRequest.objects.get(task=task, key="approve")


def answered_as_the_inbox_does(request: InputRequest, approver) -> InputRequest:
    """The inbox's answer view: the request read locked in a transaction of its own, answered, committed."""
    with transaction.atomic():
        locked = services.locked_for_answer(input_request_id=request.pk)
        return answer_and_send(input_request=locked, response=APPROVE_ANSWER, user=approver)


def connected(sender: Sender, server) -> None:
    """The first answer's look connects a client (that answer goes to the job); later ones find it ready."""
    assert not sender.may_send_answer(server)
    wait_until(lambda: sender.may_send_answer(server), what="the kept client")


def delivery_actors(request: InputRequest) -> list[tuple[str, str]]:
    rows = AuditEvent.objects.filter(task_id=request.task_id, action__startswith="input.").order_by("id")
    return [(row.action, row.actor_label or row.actor.username) for row in rows]


def deliveries(demo, request: InputRequest) -> int:
    task = Task.objects.get(pk=request.task_id)
    return demo_stats(demo)["deliveries"].get(f"{task.remote_task_id}/approve", 0)


def test_an_answer_to_be_sent_by_the_web_is_claimed_with_it_and_no_delivery_job_is_deferred(server, operator, approver):
    request = approval_request(server, operator)

    answered = services.answer_input(input_request=request, response=APPROVE_ANSWER, user=approver, caller_sends=True)

    assert answered.sent_by_caller
    request.refresh_from_db()
    assert (request.state, request.delivery_attempted_by) == (InputRequestState.ANSWERED, "web")
    assert request.delivery_attempted_at == request.answered_at
    assert jobs_of(DELIVERY_JOB) == []


def sweep_answers_the_web_left() -> int:
    return run(sweeps.sweep_answers_the_web_left.func)(int(timezone.now().timestamp()))


def test_should_the_web_stop_before_recording_the_send_the_sweep_hands_the_answer_to_the_job_which_asks_first(
    server, operator, approver, demo
):
    request = approval_request(server, operator)
    services.answer_input(input_request=request, response=APPROVE_ANSWER, user=approver, caller_sends=True)
    assert sweep_answers_the_web_left() == 0  # the web process may still be sending it
    waited = heartbeats.web_send_ends_seconds() + WEB_SEND_MARGIN_SECONDS
    long_ago = timezone.now() - datetime.timedelta(seconds=waited + 60)  # its claim is over: the attempt settled
    InputRequest.objects.filter(pk=request.pk).update(delivery_attempted_at=long_ago)

    assert sweep_answers_the_web_left() == 1
    [job] = jobs_of(DELIVERY_JOB)
    assert (job.status, job.lock, job.scheduled_at) == ("todo", f"answer:{request.pk}", None)
    assert InputRequest.objects.get(pk=request.pk).delivery_attempted_by == "web"  # the claim stands
    assert sweep_answers_the_web_left() == 0  # handed over once
    assert run(jobs.deliver)(request.pk, last_attempt=False) == "delivered"

    assert deliveries(demo, request) == 1
    assert InputRequest.objects.get(pk=request.pk).state == InputRequestState.DELIVERED
    assert delivery_actors(request)[-1] == ("input.delivered", "worker")


def test_on_its_kept_client_the_web_sends_the_answer_once_records_it_and_drops_the_fallback(
    server, operator, approver, demo, sender
):
    first, second = approval_request(server, operator), approval_request(server, operator)
    connected(sender, server)

    answered_as_the_inbox_does(second, approver)

    wait_until(
        lambda: InputRequest.objects.get(pk=second.pk).state == InputRequestState.DELIVERED, what="the answer delivered"
    )
    assert deliveries(demo, second) == 1
    assert delivery_actors(second) == [("input.answered", "abe"), ("input.delivered", "web")]
    assert jobs_of(DELIVERY_JOB) == []
    assert TaskPoll.objects.get(task_id=second.task_id).next_poll_at <= timezone.now()  # the tracker looks at once
    assert InputRequest.objects.get(pk=first.pk).state == InputRequestState.OPEN


def test_the_inbox_pages_answer_is_sent_by_the_web_process(server, operator, demo, sender, client):
    """The answer view in full (its middleware, its own transaction): the web process sends what it stores."""
    add_approver_groups(server, Group.objects.create(name="reviewers"))
    client.force_login(make_user("ana", APPROVERS, "reviewers"))
    request = approval_request(server, operator)
    connected(sender, server)

    answer_url = reverse("tasks:answer", args=[request.pk])
    answered = client.post(answer_url, {"action": "decline"}, headers={"HX-Request": "true"})

    assert answered.status_code == 200 and "answered by you" in answered.text
    wait_until(lambda: InputRequest.objects.get(pk=request.pk).state == InputRequestState.DELIVERED, what="delivered")
    assert delivery_actors(request) == [("input.answered", "ana"), ("input.delivered", "web")]
    assert deliveries(demo, request) == 1


def test_an_answer_through_the_json_api_is_sent_by_the_web_process(server, operator, demo, sender, client):
    """POST /api/input-requests/<id>/answer goes as the inbox's answer does."""
    add_approver_groups(server, Group.objects.create(name="reviewers"))
    _, secret = create_token(user=make_user("ana", APPROVERS, "reviewers"), name="ana's script")
    request = approval_request(server, operator)
    connected(sender, server)

    answered = client.post(
        f"/api/input-requests/{request.pk}/answer",
        data={"action": "accept", "content": APPROVE_ANSWER["content"]},
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}"},
    )

    assert answered.status_code == 200 and answered.json()["state"] == "answered"
    wait_until(lambda: InputRequest.objects.get(pk=request.pk).state == InputRequestState.DELIVERED, what="delivered")
    assert delivery_actors(request) == [("input.answered", "ana"), ("input.delivered", "web")]
    assert deliveries(demo, request) == 1
    assert jobs_of(DELIVERY_JOB) == []


def test_an_agents_tasks_update_through_the_gateway_is_sent_by_the_web_process(server, demo, sender):
    agent = make_user("agent", OPERATORS)
    token, secret = create_token(user=agent, name="agent")
    task = services.launch(
        server=with_tools(server, "approval"), tool="approval", arguments={"action": "ship"}, user=agent, token=token
    )
    run(jobs.launch)(task.id)
    task = follow(task, lambda t: t.status == TaskStatus.INPUT_REQUIRED)
    request = InputRequest.objects.get(task=task, key="approve")
    connected(sender, server)

    update = {"taskId": str(task.id), "inputResponses": {"approve": APPROVE_ANSWER}}
    status, body = rpc(secret, "tasks/update", update, path=f"/mcp/servers/{server.name}")

    assert (status, body["result"]) == (200, {"resultType": "complete"})
    wait_until(lambda: InputRequest.objects.get(pk=request.pk).state == InputRequestState.DELIVERED, what="delivered")
    assert delivery_actors(request) == [("input.answered", "agent"), ("input.delivered", "web")]
    assert deliveries(demo, request) == 1


def test_a_refused_answer_is_recorded_as_the_jobs_refusal_is_and_never_sent_again(server, operator, approver, sender):
    request = approval_request(server, operator)
    Task.objects.filter(pk=request.task_id).update(remote_task_id="no-such-task")  # the server forgot it
    connected(sender, server)

    answered_as_the_inbox_does(request, approver)

    wait_until(lambda: ("input.delivery_failed", "web") in delivery_actors(request), what="the refusal recorded")
    request.refresh_from_db()
    assert (request.state, request.delivery_attempted_by) == (InputRequestState.ANSWERED, "")  # the claim ended
    InputRequest.objects.filter(pk=request.pk).update(delivery_attempted_at=timezone.now() - datetime.timedelta(days=1))
    assert sweep_answers_the_web_left() == 0  # not one the web process left: never sent again
    assert jobs_of(DELIVERY_JOB) == []


def test_a_claim_grown_too_old_is_withdrawn_unsent_and_the_delivery_job_sends_it_at_once(
    server, operator, approver, demo, sender
):
    request = approval_request(server, operator)
    services.answer_input(input_request=request, response=APPROVE_ANSWER, user=approver, caller_sends=True)
    claimed = InputRequest.objects.select_related("task__server").get(pk=request.pk)
    connected(sender, server)

    paused = heartbeats.claim_clock() - heartbeats.CLAIM_HOLDS_SECONDS - 1  # the process was paused past the claim
    sender.send_answer(claimed, claimed_at=paused).result(timeout=30)

    assert deliveries(demo, request) == 0
    handed_over(request)
    assert run(jobs.deliver)(request.pk) == "delivered"  # as any answer: first_claim finds no attempt made
    assert deliveries(demo, request) == 1


def handed_over(request: InputRequest) -> None:
    request.refresh_from_db()
    assert (request.delivery_attempted_at, request.delivery_attempted_by) == (None, "")
    [now] = jobs_of(DELIVERY_JOB)
    assert now.status == "todo" and now.scheduled_at is None


def test_a_server_gone_while_the_client_was_idle_is_found_before_sending_and_the_job_sends_the_answer(
    demo, operator, approver, sender, monkeypatch
):
    proxy = WireRecorder(demo.url).start()
    try:
        server = create_server(name="gone", transport="http", url=proxy.url, user=None)
        request = approval_request(server, operator)
        connected(sender, server)
    finally:
        proxy.stop()
    monkeypatch.setattr(sending, "ASK_AFTER_IDLE_SECONDS", 0.0)  # idle long enough: asked before the answer

    answered_as_the_inbox_does(request, approver)

    wait_until(lambda: len(jobs_of(DELIVERY_JOB)) == 1, what="the answer handed to the delivery job")
    handed_over(request)
    assert not sender.may_send_answer(server)  # the client is given up; a new one connects for the next answer


def test_an_answer_cut_off_by_the_delivery_timeout_keeps_its_claim_and_the_job_confirms_it_never_resends(
    operator, approver, sender, settings
):
    """The server holds the answer past the web's wait (the delivery job's), then applies it: the answer may have gone
    out, so its claim stands and the job takes over; once the attempt has settled, the job asks the server, which no
    longer asks for the key: recorded as received, never sent twice."""
    settings.TASKHUB_DELIVERY_TIMEOUT_SECONDS = 0.5
    with DemoServer("--poll-interval-ms", "200", "--update-delay-ms", "4000") as slow:
        server = create_server(name="slow", transport="http", url=slow.url, user=None)
        request = approval_request(server, operator)
        connected(sender, server)

        answered_as_the_inbox_does(request, approver)

        wait_until(lambda: len(jobs_of(DELIVERY_JOB)) == 1, what="the answer handed to the delivery job")
        request.refresh_from_db()
        assert request.delivery_attempted_by == "web"  # the claim stands: it may have reached the server
        [now] = jobs_of(DELIVERY_JOB)
        assert (now.status, now.scheduled_at) == ("todo", None)
        long_ago = timezone.now() - datetime.timedelta(days=1)
        with_old_claim = InputRequest.objects.filter(pk=request.pk)
        with_old_claim.update(delivery_attempted_at=long_ago)
        assert sweep_answers_the_web_left() == 0  # it has its job: the sweep leaves it
        with_old_claim.update(delivery_attempted_at=request.delivery_attempted_at)
        # Before the attempt has settled, the job waits for it (the server may be applying the answer).
        with pytest.raises(jobs.NotBefore):
            run(jobs.deliver)(request.pk, last_attempt=False)
        wait_until(lambda: deliveries(slow, request) == 1, timeout=10, what="the server applied the answer")
        settled = timezone.now() - datetime.timedelta(seconds=settings.TASKHUB_DELIVERY_SETTLE_SECONDS + 1)
        InputRequest.objects.filter(pk=request.pk).update(delivery_attempted_at=settled)

        assert run(jobs.deliver)(request.pk, last_attempt=False) == "already received"
        assert deliveries(slow, request) == 1


@pytest.mark.parametrize(
    "why", ["under a caller's transaction", "setting off", "no client yet", "past max_concurrent_jobs"]
)
def test_where_the_web_cannot_send_the_delivery_job_sends_the_answer_at_once(
    server, operator, approver, settings, sender, why
):
    request = approval_request(server, operator)
    if why == "past max_concurrent_jobs":
        Server.objects.filter(pk=server.pk).update(max_concurrent_jobs=1)
        server.refresh_from_db()
        connected(sender, server)
        assert sender.take(server, declares_tasks=True) is not None  # a call in flight: the server's one
        answered_as_the_inbox_does(request, approver)
    elif why == "under a caller's transaction":
        connected(sender, server)
        with transaction.atomic():
            answered_as_the_inbox_does(request, approver)
    elif why == "setting off":
        connected(sender, server)
        settings.TASKHUB_WEB_SENDS_ANSWERS = False
        answered_as_the_inbox_does(request, approver)
    else:
        answered_as_the_inbox_does(request, approver)

    request.refresh_from_db()
    assert (request.state, request.delivery_attempted_at) == (InputRequestState.ANSWERED, None)
    [job] = jobs_of(DELIVERY_JOB)
    assert job.status == "todo" and job.scheduled_at is None
