"""answer_input: answers checked against the request on the server side; one answer per key, even when two race."""

import datetime
import threading

import pytest
from django.db import connection, connections, transaction

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import AlreadyAnswered, AnswerRejected, InputNoLongerOpen
from taskhub.tasks.models import InputRequest, InputRequestState
from tests.catalogue_fixtures import with_tools
from tests.helpers import wait_until

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 10},
        "email": {"type": "string", "format": "email"},
        "homepage": {"type": "string", "format": "uri"},
        "birthday": {"type": "string", "format": "date"},
        "meeting": {"type": "string", "format": "date-time"},
        "count": {"type": "integer", "minimum": 1, "maximum": 5},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "agree": {"type": "boolean"},
        "size": {"type": "string", "enum": ["S", "M", "L"]},
        "colour": {"type": "string", "oneOf": [{"const": "red", "title": "Red"}, {"const": "blue", "title": "Blue"}]},
        "toppings": {
            "type": "array",
            "items": {"type": "string", "enum": ["cheese", "ham", "olives"]},
            "minItems": 1,
            "maxItems": 2,
        },
    },
    "required": ["name", "count"],
}
FORM = {"method": "elicitation/create", "params": {"message": "Fill in", "requestedSchema": SCHEMA}}
URL = {"method": "elicitation/create", "params": {"mode": "url", "message": "Sign in", "url": "https://example.com/x"}}
VALID = {"name": "Luca", "count": 3}


def make_task(server, requests):
    task = services.launch(server=with_tools(server, "t"), tool="t", arguments={}, user=None)
    snapshot = TaskSnapshot.model_validate(
        {"taskId": f"r-{task.id}", "status": "input_required", "inputRequests": requests, "ttlMs": None}
    )
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot))


@pytest.fixture
def server(db):
    return create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)


@pytest.fixture
def approver(django_user_model):
    return django_user_model.objects.create_user("ada")


@pytest.fixture
def form(server):
    return InputRequest.objects.get(task=make_task(server, {"form": FORM, "url": URL}), key="form")


@pytest.fixture
def url_request(form):
    return InputRequest.objects.get(task_id=form.task_id, key="url")


def rejected(form, approver, response) -> AnswerRejected:
    with pytest.raises(AnswerRejected) as refused:
        services.answer_input(input_request=form, response=response, user=approver)
    form.refresh_from_db()
    assert form.state == InputRequestState.OPEN
    return refused.value


@pytest.mark.parametrize(
    "content",
    [
        VALID,
        {**VALID, "email": "ada@example.com", "homepage": "https://example.com/a?b=c", "agree": False},
        {**VALID, "birthday": "1815-12-10", "meeting": "2026-07-28T14:30:00Z", "ratio": 0.5, "size": "M"},
        {**VALID, "colour": "blue", "toppings": ["cheese", "olives"], "meeting": "2026-07-28T14:30:00+02:00"},
        {**VALID, "count": 5.0, "ratio": 1},
    ],
)
def test_good_form_answers_are_recorded_with_who_and_when(form, approver, content):
    answered = services.answer_input(
        input_request=form, response={"action": "accept", "content": content}, user=approver
    )
    assert (answered.state, answered.answered_by, answered.answer) == (
        "answered",
        approver,
        {"action": "accept", "content": content},
    )
    assert answered.answered_at is not None
    event = AuditEvent.objects.get(action="input.answered")
    assert (event.actor_label, event.data["key"], event.data["answer"]["content"]) == ("ada", "form", content)


@pytest.mark.parametrize(
    ("content", "field", "message"),
    [
        ({"count": 3}, "name", "this field is required"),
        ({"name": "Luca"}, "count", "this field is required"),
        ({**VALID, "name": 42}, "name", "must be text"),
        ({**VALID, "name": "L"}, "name", "at least 2 characters"),
        ({**VALID, "name": "Lucaaaaaaaaaa"}, "name", "at most 10 characters"),
        ({**VALID, "email": "ada-at-example"}, "email", "email address like name@example.com"),
        ({**VALID, "homepage": "example.com/page"}, "homepage", "absolute URI"),
        ({**VALID, "birthday": "10/12/1815"}, "birthday", "a date like 2026-07-28"),
        ({**VALID, "birthday": "1815-02-30"}, "birthday", "a date like"),
        ({**VALID, "meeting": "2026-07-28T14:30:00"}, "meeting", "with a time zone"),
        ({**VALID, "meeting": "2026-07-28"}, "meeting", "date and time"),
        ({**VALID, "count": 2.5}, "count", "whole number"),
        ({**VALID, "count": "3"}, "count", "whole number"),
        ({**VALID, "count": True}, "count", "whole number"),
        ({**VALID, "count": 0}, "count", "at least 1"),
        ({**VALID, "count": 6}, "count", "at most 5"),
        ({**VALID, "ratio": "half"}, "ratio", "must be a number"),
        ({**VALID, "ratio": 1.5}, "ratio", "at most 1"),
        ({**VALID, "agree": "yes"}, "agree", "true or false"),
        ({**VALID, "size": "XL"}, "size", "one of S, M, L"),
        ({**VALID, "colour": "green"}, "colour", "one of red, blue"),
        ({**VALID, "toppings": "cheese"}, "toppings", "list of choices"),
        ({**VALID, "toppings": ["pineapple"]}, "toppings", "pineapple not among the choices"),
        ({**VALID, "toppings": []}, "toppings", "at least 1"),
        ({**VALID, "toppings": ["cheese", "ham", "olives"]}, "toppings", "at most 2"),
        ({**VALID, "toppings": ["ham", "ham"]}, "toppings", "once"),
        ({**VALID, "password": "x"}, "password", "not asked for"),
    ],
)
def test_bad_form_answers_are_rejected_naming_the_field(form, approver, content, field, message):
    error = rejected(form, approver, {"action": "accept", "content": content})
    assert message in error.field_errors[field]
    assert f"{field}: " in str(error)


def test_several_problems_are_all_named(form, approver):
    error = rejected(form, approver, {"action": "accept", "content": {"count": 9, "size": "XL"}})
    assert set(error.field_errors) == {"name", "count", "size"}


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ({"action": "maybe"}, "accept, decline or cancel, not 'maybe'"),
        ({}, "accept, decline or cancel, not None"),
        ("accept", "must be an object"),
        ({"action": "decline", "content": VALID}, "Only an accepted form answer carries content"),
        ({"action": "accept", "content": ["Luca"]}, "object of field values"),
    ],
)
def test_malformed_responses_are_rejected(form, approver, response, message):
    assert message in str(rejected(form, approver, response))


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_decline_and_cancel_carry_no_content(form, approver, action):
    answered = services.answer_input(input_request=form, response={"action": action}, user=approver)
    assert answered.answer == {"action": action}


def test_url_mode_accept_is_consent_and_has_no_content(url_request, approver):
    with pytest.raises(AnswerRejected, match="consenting to open it; it carries no content"):
        services.answer_input(input_request=url_request, response={"action": "accept", "content": {}}, user=approver)
    answered = services.answer_input(input_request=url_request, response={"action": "accept"}, user=approver)
    assert answered.answer == {"action": "accept"}


def test_a_second_answer_names_who_answered_first(form, approver, django_user_model):
    services.answer_input(input_request=form, response={"action": "decline"}, user=approver)
    bob = django_user_model.objects.create_user("bob")
    with pytest.raises(AlreadyAnswered, match=r"already answered by ada at \d{4}-\d\d-\d\d"):
        services.answer_input(input_request=form, response={"action": "accept", "content": VALID}, user=bob)
    form.refresh_from_db()
    assert (form.answered_by, form.answer) == (approver, {"action": "decline"})


def test_a_superseded_request_takes_no_answer(form, approver):
    services.expire(task=form.task)
    with pytest.raises(InputNoLongerOpen, match="no longer asks 'form'"):
        services.answer_input(input_request=form, response={"action": "decline"}, user=approver)


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_answers_on_one_key_one_wins_the_other_is_told_who(server, django_user_model):
    form = InputRequest.objects.get(task=make_task(server, {"form": FORM}), key="form")
    ada = django_user_model.objects.create_user("ada")
    bob = django_user_model.objects.create_user("bob")
    ada_answered = threading.Event()
    outcome: dict[str, object] = {}

    def ada_answers_and_commits_late():
        try:
            # Ada's answer is written but not committed while Bob answers: without the row lock Bob
            # would still read the request as open and both would win.
            with transaction.atomic():
                services.answer_input(input_request=form, response={"action": "decline"}, user=ada)
                ada_answered.set()
                outcome["bob_seen_waiting"] = wait_until(
                    someone_waits_on_a_lock, timeout=10, what="Bob waiting on the lock"
                )
            outcome["ada"] = "won"
        finally:
            ada_answered.set()
            connection.close()

    def someone_waits_on_a_lock() -> bool:
        # Its own connection: Ada's is inside her transaction, which reads pg_stat_activity once.
        watcher = connections.create_connection("default")
        try:
            with watcher.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) > 0 FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                return cursor.fetchone()[0]
        finally:
            watcher.close()

    def bob_answers():
        ada_answered.wait(10)
        try:
            services.answer_input(input_request=form, response={"action": "accept", "content": VALID}, user=bob)
            outcome["bob"] = "won"
        except AlreadyAnswered as error:
            outcome["bob"] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=ada_answers_and_commits_late), threading.Thread(target=bob_answers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    assert outcome["ada"] == "won"
    assert isinstance(outcome["bob"], AlreadyAnswered), outcome["bob"]
    assert outcome["bob"].answered_by == "ada"
    assert outcome["bob_seen_waiting"]  # Bob waited for Ada's lock rather than reading stale state
    form.refresh_from_db()
    assert (form.state, form.answered_by, form.answer) == ("answered", ada, {"action": "decline"})
    assert AuditEvent.objects.filter(action="input.answered").count() == 1


def test_a_delivered_key_listed_again_is_noted_only_by_an_answer_asked_for_after_the_delivery(form, approver):
    services.answer_input(input_request=form, response={"action": "accept", "content": VALID}, user=approver)
    services.mark_delivered(input_request=form)
    form.refresh_from_db()
    task = form.task
    still_asking = TaskSnapshot.model_validate(
        {"taskId": task.remote_task_id, "status": "input_required", "inputRequests": {"form": FORM}, "ttlMs": None}
    )
    # A poll sent before the delivery may still list the key: not the server's fault.
    before = form.delivered_at - datetime.timedelta(seconds=1)
    services.apply_snapshot(task=task, snapshot=still_asking, asked_at=before)
    assert not AuditEvent.objects.filter(task=task, action="task.protocol_error").exists()
    services.apply_snapshot(
        task=task, snapshot=still_asking, asked_at=form.delivered_at + datetime.timedelta(seconds=1)
    )
    (noted,) = AuditEvent.objects.filter(task=task, action="task.protocol_error")
    assert "asks again for the key 'form', which was answered" in noted.data["problem"]
    assert list(InputRequest.objects.filter(task=task, key="form").values_list("state", flat=True)) == ["delivered"]


def test_of_two_jobs_that_read_the_same_answer_only_one_may_send_it(form, approver):
    services.answer_input(input_request=form, response={"action": "decline"}, user=approver)
    first, second = InputRequest.objects.get(pk=form.pk), InputRequest.objects.get(pk=form.pk)
    assert services.claim_delivery(input_request=first) is True
    assert services.claim_delivery(input_request=second) is False
    # A later attempt that read the first one's claim may send again (after asking the server); only one of them.
    third, fourth = InputRequest.objects.get(pk=form.pk), InputRequest.objects.get(pk=form.pk)
    assert third.delivery_attempted_at is not None
    assert [services.claim_delivery(input_request=r) for r in (third, fourth)] == [True, False]


def test_an_answer_that_is_not_waiting_for_delivery_cannot_be_claimed(form):
    assert services.claim_delivery(input_request=form) is False  # open: not answered yet


def test_an_answer_sent_and_no_longer_asked_for_is_delivered_even_when_its_sender_never_recorded_it(form, approver):
    # A worker claimed the answer and sent it, then died before it recorded the server's acknowledgement.
    services.answer_input(input_request=form, response={"action": "decline"}, user=approver)
    assert services.claim_delivery(input_request=InputRequest.objects.get(pk=form.pk)) is True
    form.refresh_from_db()
    task = form.task
    still_asking = TaskSnapshot.model_validate(
        {"taskId": task.remote_task_id, "status": "input_required", "inputRequests": {"form": FORM}, "ttlMs": None}
    )
    moved_on = TaskSnapshot.model_validate({"taskId": task.remote_task_id, "status": "working", "ttlMs": None})
    after = form.delivery_attempted_at + datetime.timedelta(milliseconds=5)

    # Listed still: not received yet. Gone, but asked for before the attempt: that answer says nothing of it.
    services.apply_snapshot(task=task, snapshot=still_asking, asked_at=after)
    services.apply_snapshot(task=task, snapshot=moved_on, asked_at=form.delivery_attempted_at)
    services.apply_snapshot(task=task, snapshot=moved_on)  # a notification: when it was "asked" is unknown
    assert InputRequest.objects.get(pk=form.pk).state == InputRequestState.ANSWERED

    assert services.apply_snapshot(task=task, snapshot=moved_on, asked_at=after) is True  # the answer changed
    form.refresh_from_db()
    assert form.state == InputRequestState.DELIVERED
    (delivered,) = AuditEvent.objects.filter(task=task, action="input.delivered")
    assert delivered.data == {
        "key": "form",
        "mrtr_round": 0,
        "confirmed_by": "tasks/get: the server no longer asks for the key",
    }


def test_an_answer_never_sent_is_not_confirmed_by_its_key_being_gone(form, approver):
    services.answer_input(input_request=form, response={"action": "decline"}, user=approver)
    task = form.task
    cancelled = TaskSnapshot.model_validate({"taskId": task.remote_task_id, "status": "cancelled", "ttlMs": None})
    services.apply_snapshot(
        task=task, snapshot=cancelled, asked_at=datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
    )
    assert InputRequest.objects.get(pk=form.pk).state == InputRequestState.ANSWERED
    assert not AuditEvent.objects.filter(task=task, action="input.delivered").exists()
