"""Task services: launch, launch outcomes, snapshots (idempotent, terminal is final), input requests, cancel, expiry."""

from functools import partial

import pytest
from django.db import DataError, connection
from django.test.utils import CaptureQueriesContext

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated, ToolCompleted, ToolInputRequired
from taskhub.servers.services import create_server, update_server
from taskhub.tasks import services, signals
from taskhub.tasks.errors import InvalidTransition, LaunchRefused, TaskAlreadyFinished, UnknownTool
from taskhub.tasks.models import (
    STATUS_MESSAGE_MAX_CHARS,
    TRUNCATION_NOTE,
    InputRequest,
    InputRequestState,
    Task,
    TaskPoll,
    TaskStatus,
)
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot as snapshot_any_time

pytestmark = pytest.mark.django_db

NAME_REQUEST = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Your name?",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}
CONFIRM_REQUEST = {"method": "elicitation/create", "params": {"message": "Go on?", "requestedSchema": {}}}


snapshot = partial(snapshot_any_time, last_updated_at="2026-07-28T10:00:01Z")


def audit(task) -> list[str]:
    return list(AuditEvent.objects.filter(task_id=task.id).order_by("id").values_list("action", flat=True))


def states(task) -> dict[str, str]:
    return dict(InputRequest.objects.filter(task_id=task.id, mrtr_round=0).values_list("key", "state"))


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("olga")


@pytest.fixture
def server():
    return create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)


@pytest.fixture
def launched(server, operator):
    with_tools(server, "slow_compute", "t")
    return services.launch(server=server, tool="slow_compute", arguments={"seconds": 5}, user=operator)


@pytest.fixture
def live(launched):
    """A task the server made durable, in status working."""
    return services.record_launch_outcome(task=launched, outcome=TaskCreated(task=snapshot()))


# --- launch and its outcomes -------------------------------------------------------------------------


def test_launch_writes_the_task_before_anything_is_sent(launched, operator, django_capture_on_commit_callbacks):
    assert launched.status == TaskStatus.LAUNCHING and launched.remote_task_id is None
    assert (launched.tool, launched.arguments, launched.launched_by) == ("slow_compute", {"seconds": 5}, operator)
    event = AuditEvent.objects.get(task_id=launched.id)
    assert (event.action, event.actor_label, event.server_id) == ("task.launched", "olga", launched.server_id)


def test_launch_publishes_after_commit(server, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        services.launch(server=with_tools(server, "t"), tool="t", arguments={}, user=None)
    assert len(callbacks) == 1


def test_launch_refuses_a_disabled_server(server):
    update_server(server=server, user=None, enabled=False)
    with pytest.raises(InvalidTransition, match="'demo' is disabled"):
        services.launch(server=server, tool="t", arguments={}, user=None)
    assert not Task.objects.exists()


def test_launch_refuses_a_tool_the_catalogue_does_not_list(server):
    with pytest.raises(UnknownTool, match="has no tool 'ghost' in its catalogue"):
        services.launch(server=server, tool="ghost", arguments={}, user=None)
    assert not Task.objects.exists() and not AuditEvent.objects.filter(action="task.launched").exists()


@pytest.mark.parametrize(
    ("arguments", "field_errors"),
    [
        ({"seconds": "five"}, {"seconds": "must be a whole number"}),
        ({}, {"seconds": "this field is required"}),
        ({"seconds": 0, "extra": 1}, {"seconds": "must be at least 1", "extra": "this field was not asked for"}),
        ([5], {"": "the values must be a JSON object of named fields"}),
    ],
)
def test_launch_refuses_arguments_that_do_not_fit_the_tools_schema(server, arguments, field_errors):
    schema = {
        "type": "object",
        "properties": {"seconds": {"type": "integer", "minimum": 1}},
        "required": ["seconds"],
        "additionalProperties": False,
    }
    with_tools(server, {"name": "strict", "inputSchema": schema})
    with pytest.raises(LaunchRefused) as refused:
        services.launch(server=server, tool="strict", arguments=arguments, user=None)
    assert refused.value.field_errors == field_errors
    assert str(refused.value).startswith("The arguments do not fit the tool's input schema:")
    assert not Task.objects.exists() and not AuditEvent.objects.filter(action="task.launched").exists()


def test_a_synchronous_result_is_a_completed_task(launched):
    result = {"content": [{"type": "text", "text": "hi"}], "isError": False}
    task = services.record_launch_outcome(task=launched, outcome=ToolCompleted(result=result))
    assert (task.status, task.result, task.is_terminal) == (TaskStatus.COMPLETED, result, True)
    assert task.finished_at is not None and not TaskPoll.objects.exists()
    assert audit(task) == ["task.launched", "task.launch_answered"]


def test_mrtr_input_becomes_input_requests_of_a_round_and_a_new_round_supersedes_the_last(launched):
    outcome = ToolInputRequired(input_requests={"name": NAME_REQUEST}, request_state="opaque-1")
    task = services.record_launch_outcome(task=launched, outcome=outcome)
    assert (task.status, task.mrtr_request_state) == (TaskStatus.INPUT_REQUIRED, "opaque-1")
    request = InputRequest.objects.get(task=task)
    assert (request.mrtr_round, request.key, request.state, request.mode) == (1, "name", "open", "form")
    # The launch job retries tools/call (status back to launching in part 2); the server asks again.
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.LAUNCHING)
    services.record_launch_outcome(
        task=task, outcome=ToolInputRequired(input_requests={"name": NAME_REQUEST}, request_state=None)
    )
    rounds = list(InputRequest.objects.filter(task=task).order_by("mrtr_round").values_list("mrtr_round", "state"))
    assert rounds == [(1, "superseded"), (2, "open")]


def test_a_task_handle_stores_the_remote_task_and_is_followed(live):
    assert (live.remote_task_id, live.status, live.ttl_ms) == ("remote-1", TaskStatus.WORKING, 60000)
    assert live.remote_created_at == "2026-07-28T10:00:00Z"
    assert TaskPoll.objects.filter(task=live).exists()


def test_an_outcome_is_recorded_once(live):
    with pytest.raises(InvalidTransition, match="not launching"):
        services.record_launch_outcome(task=live, outcome=ToolCompleted(result={"content": []}))


def test_launch_outcome_unknown_is_kept_and_not_cancellable(launched):
    assert services.mark_launch_unknown(task=launched, reason="connection lost after sending") is True
    assert services.mark_launch_unknown(task=launched, reason="again") is False
    task = Task.objects.get(pk=launched.pk)
    assert (task.status, task.status_message) == (TaskStatus.LAUNCH_UNKNOWN, "connection lost after sending")
    assert audit(task) == ["task.launched", "task.launch_unknown"]
    with pytest.raises(InvalidTransition, match="no remote task to cancel"):
        services.request_cancel(task=task, user=None)


def test_a_failing_service_leaves_neither_state_nor_audit(launched):
    too_long_key = "k" * 600  # longer than the column: the insert of the input request fails last
    outcome = TaskCreated(task=snapshot("input_required", inputRequests={too_long_key: NAME_REQUEST}))
    with pytest.raises(DataError):
        services.record_launch_outcome(task=launched, outcome=outcome)
    task = Task.objects.get(pk=launched.pk)
    assert (task.status, task.remote_task_id) == (TaskStatus.LAUNCHING, None)
    assert audit(task) == ["task.launched"]
    assert not TaskPoll.objects.exists() and not InputRequest.objects.exists()


# --- apply_snapshot ------------------------------------------------------------------------------------


def test_the_same_snapshot_twice_writes_nothing_the_second_time(live):
    progressed = snapshot(statusMessage="step 2 of 5", pollIntervalMs=2000)
    assert services.apply_snapshot(task=live, snapshot=progressed) is True
    updated_at = Task.objects.get(pk=live.pk).updated_at
    events = AuditEvent.objects.count()
    assert services.apply_snapshot(task=live, snapshot=progressed) is False
    assert Task.objects.get(pk=live.pk).updated_at == updated_at
    assert AuditEvent.objects.count() == events
    assert audit(live)[-1] == "task.launch_answered"  # a status message alone is progress, not audit (issue 36)
    assert list(live.progress_messages.values_list("text", flat=True)) == ["step 2 of 5"]


def test_last_updated_at_alone_is_not_a_change(live):
    assert services.apply_snapshot(task=live, snapshot=snapshot(lastUpdatedAt="2026-07-28T11:11:11Z")) is False
    assert Task.objects.get(pk=live.pk).remote_last_updated_at == "2026-07-28T10:00:01Z"


def test_a_status_change_is_audited_with_from_to_and_source(live):
    services.apply_snapshot(task=live, snapshot=snapshot("input_required", inputRequests={}), source="notification")
    event = AuditEvent.objects.filter(task_id=live.id, action="task.status_changed").get()
    assert (event.data["from"], event.data["to"], event.data["source"]) == ("working", "input_required", "notification")


def test_completion_stores_the_result_and_stops_following(live):
    result = {"content": [{"type": "text", "text": "done"}], "isError": False}
    assert services.apply_snapshot(
        task=live, snapshot=snapshot("completed", result={**result, "resultType": "complete"})
    )
    task = Task.objects.get(pk=live.pk)
    assert (task.status, task.result, task.is_terminal) == (TaskStatus.COMPLETED, result, True)
    assert task.finished_at is not None and not TaskPoll.objects.exists()


@pytest.fixture
def task_changes():
    """What task_changed's receivers are told, in order."""
    heard = []

    def hear(sender, **kwargs):
        heard.append({key: kwargs[key] for key in ("task_id", "server_id", "asks")})

    signals.task_changed.connect(hear, dispatch_uid="test.task_changes")
    yield heard
    signals.task_changed.disconnect(dispatch_uid="test.task_changes")


def test_a_change_of_a_task_that_never_asked_reads_no_input_requests_and_names_its_audience(
    live, task_changes, django_capture_on_commit_callbacks
):
    done = snapshot("completed", result={"content": [], "isError": False})
    with django_capture_on_commit_callbacks() as callbacks, CaptureQueriesContext(connection) as statements:
        services.apply_snapshot(task=live, snapshot=done)
    # Only the locked read asks whether the task has requests: nothing to supersede, confirm or open.
    assert sum("tasks_inputrequest" in query["sql"] for query in statements) == 1
    for callback in callbacks:
        callback()
    # The pages are told the task's server and that it asks nothing: the publish looks nothing up.
    assert task_changes == [{"task_id": live.id, "server_id": live.server_id, "asks": False}]


def test_a_change_of_a_task_that_asks_tells_the_inbox_too(live, task_changes, django_capture_on_commit_callbacks):
    asking = snapshot("input_required", inputRequests={"name": NAME_REQUEST})
    with django_capture_on_commit_callbacks(execute=True):
        services.apply_snapshot(task=live, snapshot=asking)
    with django_capture_on_commit_callbacks(execute=True):
        services.apply_snapshot(task=live, snapshot=snapshot(statusMessage="thanks"))  # asks no more
    assert states(live) == {"name": "superseded"}
    assert [change["asks"] for change in task_changes] == [True, True]
    assert {change["server_id"] for change in task_changes} == {live.server_id}


def test_a_terminal_status_never_changes_and_a_contradiction_is_recorded_once(live):
    services.apply_snapshot(task=live, snapshot=snapshot("failed", error={"code": -32603, "message": "boom"}))
    contradiction = snapshot("working", statusMessage="back from the dead")
    assert services.apply_snapshot(task=live, snapshot=contradiction) is False
    assert services.apply_snapshot(task=live, snapshot=contradiction) is False
    task = Task.objects.get(pk=live.pk)
    assert (task.status, task.error) == (TaskStatus.FAILED, {"code": -32603, "message": "boom"})
    errors = AuditEvent.objects.filter(task_id=live.id, action="task.protocol_error")
    assert errors.count() == 1
    assert errors.get().data["contradictions"]["status"] == {"stored": "failed", "received": "working"}


def test_the_same_terminal_snapshot_again_is_no_contradiction(live):
    done = snapshot("completed", result={"content": [], "isError": False})
    services.apply_snapshot(task=live, snapshot=done)
    assert (
        services.apply_snapshot(
            task=live, snapshot=snapshot("completed", result={"content": [], "isError": False}, statusMessage="x")
        )
        is False
    )
    assert "task.protocol_error" not in audit(live)


def test_a_snapshot_of_another_remote_task_is_refused(live):
    with pytest.raises(InvalidTransition, match="'other'"):
        services.apply_snapshot(task=live, snapshot=snapshot(taskId="other"))


def test_a_snapshot_before_the_remote_task_is_known_is_refused(launched):
    with pytest.raises(InvalidTransition, match="no remote task yet"):
        services.apply_snapshot(task=launched, snapshot=snapshot())


def test_status_message_is_capped_with_a_note(live):
    services.apply_snapshot(task=live, snapshot=snapshot(statusMessage="x" * 10_000))
    message = Task.objects.get(pk=live.pk).status_message
    assert len(message) == STATUS_MESSAGE_MAX_CHARS and message.endswith(TRUNCATION_NOTE)
    assert services.apply_snapshot(task=live, snapshot=snapshot(statusMessage="x" * 10_000)) is False


def test_keys_become_input_requests_once_however_often_they_repeat(live):
    asking = snapshot("input_required", inputRequests={"name": NAME_REQUEST, "confirm": CONFIRM_REQUEST})
    assert services.apply_snapshot(task=live, snapshot=asking) is True
    assert services.apply_snapshot(task=live, snapshot=asking) is False
    assert states(live) == {"name": "open", "confirm": "open"}
    assert audit(live).count("task.input_requested") == 2


def test_open_keys_that_vanish_are_superseded_and_answered_ones_stay(live, operator):
    services.apply_snapshot(
        task=live, snapshot=snapshot("input_required", inputRequests={"name": NAME_REQUEST, "confirm": CONFIRM_REQUEST})
    )
    name = InputRequest.objects.get(task=live, key="name")
    services.answer_input(input_request=name, response={"action": "accept", "content": {"name": "Luca"}}, user=operator)
    # The server has the answer for "name" and withdrew "confirm"; it asks a new question.
    services.apply_snapshot(task=live, snapshot=snapshot("input_required", inputRequests={"size": CONFIRM_REQUEST}))
    assert states(live) == {"name": "answered", "confirm": "superseded", "size": "open"}
    # A superseded key listed again is not reopened: keys are never reused.
    services.apply_snapshot(task=live, snapshot=snapshot("input_required", inputRequests={"confirm": CONFIRM_REQUEST}))
    assert states(live) == {"name": "answered", "confirm": "superseded", "size": "superseded"}


def test_leaving_input_required_supersedes_what_is_still_open(live):
    services.apply_snapshot(task=live, snapshot=snapshot("input_required", inputRequests={"confirm": CONFIRM_REQUEST}))
    services.apply_snapshot(task=live, snapshot=snapshot("working"))
    assert states(live) == {"confirm": "superseded"}


def test_a_poll_answered_before_a_stored_notification_changes_nothing(live):
    """A poll in flight while the server moved on, answered after the notification of the move was stored: its
    older `lastUpdatedAt` marks it stale, so the request stays open (superseded, it would never reopen)."""
    asking = snapshot(
        "input_required", inputRequests={"confirm": CONFIRM_REQUEST}, last_updated_at="2026-07-28T10:00:05Z"
    )
    assert services.apply_snapshot(task=live, snapshot=asking, source="notification") is True
    stale = snapshot("working", statusMessage="still working", last_updated_at="2026-07-28T10:00:04.999Z")
    assert services.apply_snapshot(task=live, snapshot=stale) is False
    assert Task.objects.get(pk=live.pk).status == TaskStatus.INPUT_REQUIRED and states(live) == {"confirm": "open"}
    # A time the peer leaves out, or one it writes unreadably, is not a reason to ignore what it says.
    assert services.apply_snapshot(task=live, snapshot=snapshot("working", last_updated_at="yesterday")) is True
    assert states(live) == {"confirm": "superseded"}


def test_a_task_created_in_input_required_opens_its_requests(launched):
    task = services.record_launch_outcome(
        task=launched, outcome=TaskCreated(task=snapshot("input_required", inputRequests={"name": NAME_REQUEST}))
    )
    assert states(task) == {"name": "open"}


# --- delivery, cancel, expiry --------------------------------------------------------------------------


def test_an_answer_is_delivered_once(live, operator):
    services.apply_snapshot(task=live, snapshot=snapshot("input_required", inputRequests={"confirm": CONFIRM_REQUEST}))
    confirm = InputRequest.objects.get(task=live)
    with pytest.raises(InvalidTransition, match="only answers are delivered"):
        services.mark_delivered(input_request=confirm)
    services.answer_input(input_request=confirm, response={"action": "decline"}, user=operator)
    assert services.mark_delivered(input_request=confirm) is True
    assert services.mark_delivered(input_request=confirm) is False
    confirm.refresh_from_db()
    assert confirm.state == InputRequestState.DELIVERED and confirm.delivered_at is not None
    assert audit(live).count("input.delivered") == 1


def test_cancel_is_recorded_once_with_who_asked(live, operator):
    services.request_cancel(task=live, user=operator)
    first = Task.objects.get(pk=live.pk).cancel_requested_at
    services.request_cancel(task=live, user=None)
    task = Task.objects.get(pk=live.pk)
    assert (task.cancel_requested_at, task.cancel_requested_by) == (first, operator)
    assert audit(task).count("task.cancel_requested") == 1
    assert services.mark_cancel_delivered(task=task) is True
    assert services.mark_cancel_delivered(task=task) is False
    assert audit(task)[-1] == "task.cancel_delivered"


def test_cancel_of_a_finished_task_is_refused(live):
    services.apply_snapshot(task=live, snapshot=snapshot("cancelled"))
    with pytest.raises(TaskAlreadyFinished, match="already cancelled; there is nothing to cancel"):
        services.request_cancel(task=live, user=None)


def test_expiry_is_final_and_supersedes_open_requests(live):
    services.apply_snapshot(task=live, snapshot=snapshot("input_required", inputRequests={"confirm": CONFIRM_REQUEST}))
    assert services.expire(task=live) is True
    assert services.expire(task=live) is False
    task = Task.objects.get(pk=live.pk)
    assert (task.status, task.is_terminal) == (TaskStatus.EXPIRED, True)
    assert states(task) == {"confirm": "superseded"} and not TaskPoll.objects.exists()
    assert services.apply_snapshot(task=task, snapshot=snapshot("working")) is False


# --- the launch job's outcomes, decided here -----------------------------------------------------------


def test_a_launch_given_up_before_sending_failed_and_says_it_was_not_sent(launched):
    assert services.give_up_launch(task_id=launched.id, attempts=9, error=ConnectionError("no route")) is True
    task = Task.objects.get(pk=launched.pk)
    assert task.status == TaskStatus.FAILED
    assert task.error == {
        "message": "Gave up after 9 attempts (no route): the tool call was not sent.",
        "kind": "ConnectionError",
    }
    assert AuditEvent.objects.get(task_id=task.id, action="task.launch_failed").data["sent"] is False


def test_a_launch_given_up_after_sending_is_unknown_never_failed(launched):
    assert services.mark_launch_sent(task=launched) is not None
    assert services.give_up_launch(task_id=launched.id, attempts=1, error=TimeoutError()) is True
    task = Task.objects.get(pk=launched.pk)
    assert (task.status, task.status_message) == (
        TaskStatus.LAUNCH_UNKNOWN,
        "Gave up after 1 attempt (TimeoutError): tools/call was sent, but no answer was recorded.",
    )


def test_giving_up_a_launch_whose_outcome_is_known_changes_nothing(live):
    assert services.give_up_launch(task_id=live.id, attempts=1, error=TimeoutError()) is False
    assert audit(live) == ["task.launched", "task.launch_answered"]


def test_the_answer_to_an_mrtr_retry_is_the_delivery_of_the_answers_it_carried(launched, operator):
    outcome = ToolInputRequired(input_requests={"name": NAME_REQUEST}, request_state="opaque-1")
    task = services.record_launch_outcome(task=launched, outcome=outcome)
    request = InputRequest.objects.get(task=task)
    response = {"action": "accept", "content": {"name": "Ada"}}
    services.answer_input(input_request=request, response=response, user=operator)
    assert services.schedule_mrtr_retry(task=task, mrtr_round=request.mrtr_round) is True
    call = services.mark_launch_sent(task=task)
    assert call.answered_request_ids == (request.pk,)

    services.record_launch_outcome(
        task=task, outcome=ToolCompleted(result={"content": []}), answered_request_ids=call.answered_request_ids
    )
    request.refresh_from_db()
    assert request.state == InputRequestState.DELIVERED
    assert audit(task)[-2:] == ["task.launch_answered", "input.delivered"]
