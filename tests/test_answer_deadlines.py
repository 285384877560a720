"""Answer deadlines of approval policies: what taskhub does when nobody answers in time (decline, cancel the task, a
fixed answer, escalation; the gate before the call ends not approved), once only, with the notices it sends, and
how a policy's deadline is set and refused (page, API, command)."""

import datetime
import io
import json
import threading
import time
from contextlib import contextmanager

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import Client
from django.urls import reverse

from taskhub.accounts import permissions
from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.approvals import deadlines, signals
from taskhub.approvals.models import ApprovalPolicy
from taskhub.approvals.services import create_policy, describe_policy, update_policy
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import AlreadyAnswered, PolicyRefused
from taskhub.tasks.input_cards import card_for
from taskhub.tasks.models import GATE_METHOD, InputRequest, InputRequestState, Task
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools

SECOND = datetime.timedelta(seconds=1)
FORM = {
    "method": "elicitation/create",
    "params": {
        "message": "Ship it?",
        "requestedSchema": {
            "type": "object",
            "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
            "required": ["approved"],
        },
    },
}


@pytest.fixture
def server(db):
    return create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)


@pytest.fixture
def people(db):
    return {name: make_user(name, APPROVERS) for name in ("olga", "pete", "quinn")}


@pytest.fixture
def heard():
    """What the approvals' signals told their receivers: [(signal name, kwargs)]."""
    said = []

    def near(sender, signal, **kwargs):
        said.append(("deadline_near", kwargs))

    def applied(sender, signal, **kwargs):
        said.append(("default_applied", kwargs))

    signals.deadline_near.connect(near)
    signals.default_applied.connect(applied)
    yield said
    signals.deadline_near.disconnect(near)
    signals.default_applied.disconnect(applied)


def deadline_policy(server, *, within=30, **terms) -> ApprovalPolicy:
    return create_policy(
        server=server, tool="deploy", answer_within=datetime.timedelta(seconds=within), user=None, **terms
    )


def open_request(server, *, launched_by=None) -> InputRequest:
    task = services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=launched_by)
    snapshot = TaskSnapshot.model_validate(
        {"taskId": f"r-{task.id}", "status": "input_required", "inputRequests": {"q": FORM}, "ttlMs": None}
    )
    services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot))
    return InputRequest.objects.select_related("task__server").get(task=task, key="q")


def jobs(name: str, **args) -> list[tuple]:
    where = "".join(f" AND args->>'{key}' = %s" for key in args)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT scheduled_at FROM procrastinate_jobs WHERE task_name = %s{where} ORDER BY scheduled_at",
            [name, *(str(value) for value in args.values())],
        )
        return cursor.fetchall()


def applied_rows(input_request) -> list[dict]:
    return list(
        AuditEvent.objects.filter(task_id=input_request.task_id, action="input.default_applied")
        .order_by("id")
        .values_list("data", flat=True)
    )


def test_a_deadline_is_fixed_when_the_request_opens_and_a_later_edit_does_not_move_it(server):
    policy = deadline_policy(server, within=600)
    request = open_request(server)
    assert request.answer_deadline_at == request.created_at + datetime.timedelta(minutes=10)
    # Near (the last 20% or 5 minutes, whichever is shorter: here 2 minutes before) and at the deadline.
    scheduled = [row[0] for row in jobs("taskhub.answer_deadline", input_request_id=request.pk)]
    assert scheduled == [request.answer_deadline_at - datetime.timedelta(minutes=2), request.answer_deadline_at]

    update_policy(policy=policy, user=None, answer_within=datetime.timedelta(minutes=1))
    request.refresh_from_db()
    assert request.answer_deadline_at == request.created_at + datetime.timedelta(minutes=10)
    later = open_request(server)  # opens under the new terms
    assert later.answer_deadline_at == later.created_at + datetime.timedelta(minutes=1)


def test_without_a_deadline_nothing_is_scheduled(server):
    create_policy(server=server, tool="deploy", user=None)
    request = open_request(server)
    assert request.answer_deadline_at is None and jobs("taskhub.answer_deadline") == []
    assert deadlines.check_deadline(input_request_id=request.pk) is None


def test_decline_at_the_deadline_is_sent_and_audited_naming_the_policy(
    server, people, heard, django_capture_on_commit_callbacks
):
    policy = deadline_policy(server, within=30, at_deadline="decline")
    request = open_request(server, launched_by=people["olga"])
    deadline = request.answer_deadline_at
    card = card_for(request, people["pete"])
    assert card.deadline.words.startswith("answer within ") and card.deadline.state == "due"

    with django_capture_on_commit_callbacks(execute=True):
        assert deadlines.check_deadline(input_request_id=request.pk, now=deadline - 10 * SECOND) is None
        assert deadlines.check_deadline(input_request_id=request.pk, now=deadline - 5 * SECOND) is None
    assert heard == [("deadline_near", {"input_request_id": request.pk, "policy_id": policy.pk, "deadline": deadline})]
    assert card_for(request, people["pete"]).deadline.state in ("due", "near")  # rendered from now, not from above

    with django_capture_on_commit_callbacks(execute=True):
        assert deadlines.check_deadline(input_request_id=request.pk, now=deadline + SECOND) == "declined"
        assert deadlines.check_deadline(input_request_id=request.pk, now=deadline + 2 * SECOND) is None
    request.refresh_from_db()
    assert request.state == InputRequestState.ANSWERED and request.answer == {"action": "decline"}
    assert request.answered_by is None and request.answer_comment == "no answer before the deadline"
    assert len(jobs("taskhub.deliver_answer", input_request_id=request.pk)) == 1
    [row] = AuditEvent.objects.filter(task_id=request.task_id, action="input.default_applied")
    assert row.actor_label == "system"
    assert row.data["policy"] == policy.pk and row.data["outcome"] == "declined" and row.data["key"] == "q"
    assert heard[1:] == [
        ("default_applied", {"input_request_id": request.pk, "policy_id": policy.pk, "outcome": "declined"})
    ]
    answered = card_for(InputRequest.objects.select_related("task__server").get(pk=request.pk), people["pete"])
    assert answered.answered_by_name == "taskhub, at the deadline" and answered.deadline is None
    with pytest.raises(AlreadyAnswered, match="taskhub, at the deadline"):
        services.answer_input(input_request=request, response={"action": "decline"}, user=people["pete"])


def test_a_past_due_request_says_so_on_its_card(server, people):
    deadline_policy(server, within=1)
    request = open_request(server)
    InputRequest.objects.filter(pk=request.pk).update(
        answer_deadline_at=request.created_at - SECOND  # the worker is late: the card must still tell the truth
    )
    request.refresh_from_db()
    card = card_for(request, people["pete"])
    assert card.deadline.state == "past" and "past due" in card.deadline.words


def test_cancel_the_task_at_the_deadline(server, people):
    deadline_policy(server, at_deadline="cancel")
    request = open_request(server)
    outcome = deadlines.check_deadline(input_request_id=request.pk, now=request.answer_deadline_at)
    assert outcome == "cancelled"
    task = Task.objects.get(pk=request.task_id)
    assert task.cancel_requested_at is not None and task.cancel_requested_by is None
    assert len(jobs("taskhub.deliver_cancel", task_id=task.pk)) == 1
    assert jobs("taskhub.deliver_answer", input_request_id=request.pk) == []
    assert [row["outcome"] for row in applied_rows(request)] == ["cancelled"]
    assert deadlines.check_deadline(input_request_id=request.pk, now=request.answer_deadline_at + SECOND) is None


def test_a_fixed_answer_is_checked_against_the_form_and_sent(server, people):
    fixed = {"action": "accept", "content": {"approved": False, "note": "timed out"}}
    deadline_policy(server, at_deadline="answer", deadline_answer=fixed)
    request = open_request(server)
    assert deadlines.check_deadline(input_request_id=request.pk, now=request.answer_deadline_at) == "answered"
    request.refresh_from_db()
    assert request.answer == fixed and len(jobs("taskhub.deliver_answer", input_request_id=request.pk)) == 1
    [row] = applied_rows(request)
    assert row["answer"] == fixed and "problem" not in row


def test_a_fixed_answer_that_does_not_fit_the_form_is_recorded_and_declined_instead(server, people):
    deadline_policy(server, at_deadline="answer", deadline_answer={"action": "accept", "content": {"note": "x"}})
    request = open_request(server)
    assert deadlines.check_deadline(input_request_id=request.pk, now=request.answer_deadline_at) == "declined"
    request.refresh_from_db()
    assert request.answer == {"action": "decline"}
    [row] = applied_rows(request)
    assert row["at_deadline"] == "answer" and "the fixed answer does not fit this request" in row["problem"]
    assert "approved" in row["problem"] and "declined instead" in row["problem"]


def test_escalation_hands_the_request_to_the_group_which_answers_it_from_then_on(server, people):
    finance = Group.objects.create(name="finance")
    people["quinn"].groups.add(finance)
    policy = deadline_policy(server, at_deadline="escalate", escalation_group=finance)
    policy.users.set([people["pete"]])
    request = open_request(server)
    assert deadlines.check_deadline(input_request_id=request.pk, now=request.answer_deadline_at) == "escalated"
    request = InputRequest.objects.select_related("task__server", "escalated_to").get(pk=request.pk)
    assert request.state == InputRequestState.OPEN and request.escalated_to == finance
    assert [row["escalated_to"] for row in applied_rows(request)] == ["finance"]
    assert deadlines.check_deadline(input_request_id=request.pk, now=request.answer_deadline_at + SECOND) is None

    card = card_for(request, people["pete"])
    assert card.escalated_to == "finance" and not card.may_answer and card.deadline is None
    with pytest.raises(PolicyRefused, match="escalated to finance"):
        services.answer_input(input_request=request, response={"action": "decline"}, user=people["pete"])
    visible = InputRequest.objects.filter(permissions.requests_user_may_answer(people["quinn"]))
    assert list(visible) == [request]
    assert list(InputRequest.objects.filter(permissions.requests_for_me(people["quinn"]))) == [request]
    assert not InputRequest.objects.filter(permissions.requests_user_may_answer(people["pete"])).exists()
    assert server in permissions.servers_user_may_approve(people["quinn"])
    assert card_for(request, people["quinn"]).may_answer
    client = Client()
    client.force_login(people["quinn"])
    inbox = client.get(reverse("tasks:inbox")).content.decode()
    assert '<span class="ir-for ir-escalated">escalated to finance</span>' in inbox and "ir-deadline" not in inbox
    services.answer_input(
        input_request=request, response={"action": "accept", "content": {"approved": True}}, user=people["quinn"]
    )
    request.refresh_from_db()
    assert request.state == InputRequestState.ANSWERED and request.answered_by == people["quinn"]


def test_a_gate_at_its_deadline_ends_not_approved_and_nothing_is_sent(server, people):
    create_policy(
        server=server,
        tool="deploy",
        gate_before_call=True,
        answer_within=datetime.timedelta(seconds=5),
        at_deadline="answer",
        deadline_answer={"action": "accept"},  # never lets a launch through by itself
        user=None,
    )
    task = services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=people["olga"])
    gate = InputRequest.objects.get(task=task, method=GATE_METHOD)
    assert gate.answer_deadline_at is not None
    assert deadlines.check_deadline(input_request_id=gate.pk, now=gate.answer_deadline_at) == "not approved"
    task.refresh_from_db()
    assert task.status == "failed" and task.error == {
        "message": "not approved: no answer before the deadline",
        "kind": "not_approved",
    }
    assert jobs("taskhub.launch_task", task_id=task.pk) == []
    assert AuditEvent.objects.get(task=task, action="task.not_approved").actor_label == "system"
    assert [row["outcome"] for row in applied_rows(gate)] == ["not approved"]


def test_a_partial_n_of_m_at_the_deadline_gets_the_default_and_the_audit_says_so(server, people):
    deadline_policy(server, required_accepts=2)
    request = open_request(server)
    services.answer_input(
        input_request=request, response={"action": "accept", "content": {"approved": True}}, user=people["pete"]
    )
    assert deadlines.check_deadline(input_request_id=request.pk, now=request.answer_deadline_at) == "declined"
    [row] = applied_rows(request)
    assert row["partial"].startswith("1 of 2 acceptances before the deadline")


def test_the_sweep_catches_deadlines_whose_jobs_were_lost(server, people, heard, django_capture_on_commit_callbacks):
    deadline_policy(server, within=60)
    first, second = open_request(server), open_request(server)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs WHERE task_name = 'taskhub.answer_deadline'")
    with django_capture_on_commit_callbacks(execute=True):
        assert deadlines.sweep(now=first.answer_deadline_at - 2 * SECOND) == 0  # both near: told once each
        assert deadlines.sweep(now=first.answer_deadline_at - SECOND) == 0
        assert deadlines.sweep(now=second.answer_deadline_at + SECOND) == 2
        assert deadlines.sweep(now=second.answer_deadline_at + 2 * SECOND) == 0
    assert sorted(name for name, _ in heard) == ["deadline_near"] * 2 + ["default_applied"] * 2


# --- exactly once, under concurrency ---------------------------------------------------------------------------


@contextmanager
def task_row_held(task_id):
    """Hold the task's row lock from another connection, so callers queue on it; released on exit."""
    holder = connections.create_connection("default")
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT 1 FROM tasks_task WHERE id = %s FOR UPDATE", [str(task_id)])
            yield
            cursor.execute("COMMIT")
    finally:
        holder.close()


def waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def in_threads(*calls):
    """A thread per call (not started), and where each puts its result or exception."""
    results: list = [None] * len(calls)

    def run(index, call):
        try:
            results[index] = call()
        except Exception as error:
            results[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(index, call)) for index, call in enumerate(calls)]
    return threads, results


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_apply_the_default_once_and_a_person_at_the_same_instant_wins_or_loses_cleanly(server):
    pete = make_user("pete", APPROVERS)
    deadline_policy(server, within=1)
    for answering in (False, True):
        request = open_request(server)
        now = request.answer_deadline_at + SECOND
        calls = [lambda request=request, now=now: deadlines.check_deadline(input_request_id=request.pk, now=now)] * 2
        if answering:
            calls.append(
                lambda request=request: services.answer_input(
                    input_request=request, response={"action": "accept", "content": {"approved": True}}, user=pete
                )
            )
        threads, results = in_threads(*calls)
        # Started while the task's row is held, and let go once all of them queue on its lock: they meet there.
        with task_row_held(request.task_id):
            for thread in threads:
                thread.start()
            give_up = time.monotonic() + 20
            while waiting_on_locks() < len(calls) and time.monotonic() < give_up:
                time.sleep(0.02)
            assert waiting_on_locks() >= len(calls)
        for thread in threads:
            thread.join(20)
        request.refresh_from_db()
        applied = applied_rows(request)
        person_won = answering and isinstance(results[2], InputRequest)
        if person_won:
            assert applied == [] and results[:2] == [None, None] and request.answered_by == pete
        else:
            assert sorted(map(str, results[:2])) == ["None", "declined"] and len(applied) == 1
            assert request.answer == {"action": "decline"}
            if answering:
                assert isinstance(results[2], AlreadyAnswered)
        assert len(jobs("taskhub.deliver_answer", input_request_id=request.pk)) == 1


# --- setting a deadline: the page, the API, the command ----------------------------------------------------------


@pytest.fixture
def admin(db):
    client = Client()
    client.force_login(make_user("alex", ADMINS))
    return client


def test_the_page_sets_a_deadline_and_refuses_what_cannot_work(admin, server):
    finance = Group.objects.create(name="finance")
    form = {"server": server.pk, "tool": "deploy", "required_accepts": 1, "at_deadline": "decline"}

    def refused(**changes) -> str:
        response = admin.post(reverse("approvals:add"), {**form, **changes})
        assert response.status_code == 400 and not ApprovalPolicy.objects.exists()
        return response.content.decode()

    assert "is not a duration" in refused(answer_within="soon")
    assert "between 1 second and 30 days" in refused(answer_within="31 days")
    assert "needs an escalation group" in refused(answer_within="4 h", at_deadline="escalate")
    assert "This is not JSON" in refused(answer_within="4 h", at_deadline="answer", deadline_answer="{yes")
    assert "The fixed answer contains" in refused(
        answer_within="4 h", at_deadline="answer", deadline_answer='{"action": "accept", "content": {"a": "x\\u0000"}}'
    )
    assert "must be an object of field values" in refused(
        answer_within="4 h", at_deadline="answer", deadline_answer='{"action": "accept", "content": [1]}'
    )

    saved = admin.post(
        reverse("approvals:add"),
        {**form, "answer_within": "30 min", "at_deadline": "escalate", "escalation_group": finance.pk},
    )
    assert saved.status_code == 302
    policy = ApprovalPolicy.objects.get()
    assert policy.answer_within == datetime.timedelta(minutes=30) and policy.escalation_group == finance
    listing = admin.get(reverse("approvals:list")).content.decode()
    assert "within 30 min, then escalate to finance" in listing and "moves no deadline already running" in listing
    assert 'value="30 min"' in admin.get(reverse("approvals:edit", args=[policy.pk])).content.decode()
    described = describe_policy(policy)
    assert {key: described[key] for key in ("answer_within_seconds", "at_deadline", "escalation_group")} == {
        "answer_within_seconds": 1800,
        "at_deadline": "escalate",
        "escalation_group": "finance",
    }


def test_the_api_and_the_command_set_the_same_deadline(server):
    from taskhub.api.tokens import create_token

    _, secret = create_token(user=make_user("alex", ADMINS), name="t")
    client = Client(headers={"Authorization": f"Bearer {secret}"})

    def post(body):
        response = client.post("/api/approval-policies", json.dumps(body), "application/json")
        return response.status_code, response.json()

    fixed = {"action": "accept", "content": {"approved": False}}
    status, body = post({"server": "demo", "answer_within_seconds": 0})
    assert status == 400 and "between 1 second and 30 days" in body["error"]
    status, body = post({"server": "demo", "answer_within_seconds": 60, "at_deadline": "answer", "deadline_answer": {}})
    assert status == 400 and '"action"' in body["error"] and not ApprovalPolicy.objects.exists()
    status, created = post(
        {"server": "demo", "answer_within_seconds": 120, "at_deadline": "answer", "deadline_answer": fixed}
    )
    assert status == 201 and (created["answer_within_seconds"], created["deadline_answer"]) == (120, fixed)

    out = io.StringIO()
    call_command("approval_policy", "set", "demo", "--deadline", "3 min", "--at-deadline", "cancel", stdout=out)
    assert "within 3 min, then cancel the task" in out.getvalue()
    listed = io.StringIO()
    call_command("approval_policy", "list", "--json", stdout=listed)
    [row] = json.loads(listed.getvalue())
    policy = ApprovalPolicy.objects.select_related("server").get()
    assert {key: row[key] for key in describe_policy(policy)} == describe_policy(policy)
    assert (row["answer_within_seconds"], row["at_deadline"]) == (180, "cancel")
    assert client.get("/api/approval-policies").json()[0]["answer_within_seconds"] == 180
    with pytest.raises(CommandError, match="not a duration"):
        call_command("approval_policy", "set", "demo", "--deadline", "whenever")
    call_command("approval_policy", "set", "demo", "--deadline", "off", stdout=io.StringIO())
    assert ApprovalPolicy.objects.get().answer_within is None
    assert AuditEvent.objects.filter(action="approval_policy.updated").count() == 2
