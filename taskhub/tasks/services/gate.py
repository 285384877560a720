"""The gate before the call: a launch held until an approval, and what that approval does."""

from django.utils import timezone

from taskhub.audit.services import WORKER, record_event
from taskhub.servers.hooks import job_queue
from taskhub.tasks import hooks, signals
from taskhub.tasks.models import (
    GATE_KEY,
    GATE_METHOD,
    NOT_APPROVED,
    TASK_PHASE,
    InputRequest,
    InputRequestState,
    Task,
    TaskStatus,
)
from taskhub.tasks.services.common import _finished, _name, _start_deadline, cap_status_message


def _gate(task: Task, *, terms) -> None:
    """Hold the launch for an approval (the gate before the call): nothing is sent until it is accepted."""
    task.status_message = f"waiting for approval before the call ({terms.policy})"
    task.status_message_is_taskhubs = True
    task.save(update_fields=["status_message", "status_message_is_taskhubs", "updated_at"])
    gate = InputRequest.objects.create(
        task=task,
        mrtr_round=TASK_PHASE,
        key=GATE_KEY,
        method=GATE_METHOD,
        params={"message": f"Run {task.tool[:200]} on {task.server.name}?"},
    )
    _start_deadline(gate, terms=terms)
    record_event(
        action="task.launch_gated",
        actor_label=WORKER,
        task=task,
        data={"key": GATE_KEY, "policy": terms.policy_id, "answerers": terms.answerers},
    )
    signals.announce_input_requests_opened(task.id, [gate.pk])


def _pass_gate(
    task: Task, input_request: InputRequest, *, user, comment: str, why: str = "", data=None, token=None
) -> None:
    """The gate's answer, which nothing delivers: accepted, the launch goes out; declined or cancelled, the task ends
    not approved, and tools/call is never sent."""
    input_request.state = InputRequestState.DELIVERED
    input_request.delivered_at = input_request.answered_at
    input_request.save(update_fields=["state", "delivered_at"])
    if input_request.answer["action"] == "accept":
        task.status_message, task.status_message_is_taskhubs = "", False
        task.save(update_fields=["status_message", "status_message_is_taskhubs", "updated_at"])
        record_event(action="task.launch_approved", user=user, task=task, data={"key": input_request.key}, token=token)
        hooks.enqueue_launch(task.id, queue=job_queue(task.server))
        return
    words = "declined" if input_request.answer["action"] == "decline" else "cancelled"
    message = f"not approved: {why or f'{words} by {_name(user)}'}" + (f" ({comment})" if comment else "")
    task.status = TaskStatus.FAILED
    task.error = {"message": message, "kind": NOT_APPROVED}
    task.status_message, task.status_message_is_taskhubs = cap_status_message(message), True
    task.finished_at = timezone.now()
    task.save(
        update_fields=["status", "error", "status_message", "status_message_is_taskhubs", "finished_at", "updated_at"]
    )
    record_event(
        action="task.not_approved",
        user=user,
        task=task,
        data={"action": input_request.answer["action"], **({"comment": comment} if comment else {}), **(data or {})},
        token=token,
    )
    _finished(task)
