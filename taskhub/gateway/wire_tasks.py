"""taskhub's Task as the Tasks extension's wire shapes (CreateTaskResult, DetailedTask), read from Postgres only.

Status mapping (README, "Gateway"): launching → working (its message says why: launching, or waiting for approval
before the call), or input_required while the server asks a question in the middle of the call (a classic
elicitation); working, input_required, completed, failed, cancelled → the same; a request for input that people
answer (the tool's approval policy has them answer an agent's calls: `input_from` people) → working, "waiting for
approvers of <policy>"; launch outcome unknown, lost, expired → failed, with an error saying which (nothing in
taskhub moves them on by itself).
"""

from __future__ import annotations

from typing import Any

import mcp_types
from django.conf import settings

from taskhub.accounts import permissions
from taskhub.tasks.models import GATE_METHOD, TASK_PHASE, InputRequest, InputRequestState, Task, TaskStatus

SAME_STATUS = {
    TaskStatus.WORKING: "working",
    TaskStatus.COMPLETED: "completed",
    TaskStatus.FAILED: "failed",
    TaskStatus.CANCELLED: "cancelled",
}
ENDED_WITHOUT_OUTCOME = {
    TaskStatus.LAUNCH_UNKNOWN: "the launch outcome is unknown: the tool call may or may not have reached the server",
    TaskStatus.LOST: "lost: the server no longer knows the task",
    TaskStatus.EXPIRED: "expired: the task outlived its TTL",
}


def iso(moment) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def people_answer(task: Task) -> str | None:
    """The policy whose approvers answer this task's requests, or None when the agent answers them itself: no
    approval policy applies to the tool, or its policy passes them through (`input_from` agent)."""
    terms = permissions.answer_terms(server_id=task.server_id, tool=task.tool)
    return terms.policy if terms.policy_id is not None and terms.input_from != "agent" else None


def open_requests(task: Task, *, mrtr_round: int | None = None) -> list[InputRequest]:
    """The requests of the task that are open (the gate before the call is never the agent's to answer)."""
    requests = task.input_requests.filter(state=InputRequestState.OPEN).exclude(method=GATE_METHOD)
    if mrtr_round is not None:
        requests = requests.filter(mrtr_round=mrtr_round)
    return list(requests.order_by("pk"))


def as_input_requests(requests: list[InputRequest]) -> dict[str, Any]:
    return {request.key: {"method": request.method, "params": request.params} for request in requests}


def _envelope(task: Task) -> dict[str, Any]:
    poll = task.poll_interval_ms or settings.TASKHUB_GATEWAY_POLL_INTERVAL_MS
    return {
        "taskId": str(task.id),
        "createdAt": iso(task.created_at),
        "lastUpdatedAt": iso(task.updated_at),
        "ttlMs": task.ttl_ms if task.ttl_ms and task.ttl_ms > 0 else None,
        "pollIntervalMs": max(int(poll), 1),
    }


def error_of(task: Task) -> dict[str, Any]:
    stored = task.error if isinstance(task.error, dict) else {}
    code, message = stored.get("code"), stored.get("message")
    error: dict[str, Any] = {
        "code": code if isinstance(code, int) and not isinstance(code, bool) else mcp_types.INTERNAL_ERROR,
        "message": message if isinstance(message, str) and message else (task.status_message or "failed"),
    }
    if "data" in stored:
        error["data"] = stored["data"]
    elif stored.get("kind"):
        error["data"] = {"kind": stored["kind"]}
    return error


def status_of(task: Task) -> tuple[str, str, dict[str, Any]]:
    """(wire status, statusMessage, the status's own fields) of `task` as the agent sees it now."""
    message = task.status_message or ""
    if task.status in ENDED_WITHOUT_OUTCOME:
        why = ENDED_WITHOUT_OUTCOME[task.status]
        return "failed", message or why, {"error": {"code": mcp_types.INTERNAL_ERROR, "message": message or why}}
    if task.status == TaskStatus.LAUNCHING:
        # A question the server asks in the middle of the call (classic elicitation, held by the worker holding it):
        # the agent's to answer like any other, unless people answer this tool's requests.
        held = [request for request in open_requests(task) if request.held_by]
        if held:
            policy = people_answer(task)
            if policy is not None:
                return "working", f"waiting for approvers of {policy}", {}
            return "input_required", message, {"inputRequests": as_input_requests(held)}
        return "working", message or "launching: the tool call is on its way to the server", {}
    if task.status == TaskStatus.INPUT_REQUIRED:
        policy = people_answer(task)
        if policy is not None:
            return "working", f"waiting for approvers of {policy}", {}
        requests = open_requests(task)
        if task.remote_task_id is None:  # MRTR: only the latest round is asked for
            latest = max((request.mrtr_round for request in requests), default=TASK_PHASE)
            requests = [request for request in requests if request.mrtr_round == latest]
        if not requests:
            return "working", "the answers are on their way to the server", {}
        return "input_required", message, {"inputRequests": as_input_requests(requests)}
    status = SAME_STATUS[TaskStatus(task.status)]
    if status == "completed":
        result = task.result if isinstance(task.result, dict) else {"content": [], "isError": False}
        return status, message, {"result": result}
    if status == "failed":
        return status, message or "failed", {"error": error_of(task)}
    return status, message, {}


# What detailed_task reads of a task whose status needs no more than its row (not launching, not input_required):
# taskhub.gateway.direct reads only these (a task's arguments can be large, and a poll never shows them).
DETAILED_TASK_FIELDS = (
    "id",
    "status",
    "status_message",
    "result",
    "error",
    "created_at",
    "updated_at",
    "ttl_ms",
    "poll_interval_ms",
)


def detailed_task(task: Task) -> dict[str, Any]:
    """The `tasks/get` result."""
    status, message, fields = status_of(task)
    return {
        "resultType": "complete",
        **_envelope(task),
        "status": status,
        **({"statusMessage": message} if message else {}),
        **fields,
    }


def create_task_result(task: Task) -> dict[str, Any]:
    """The `tools/call` answer that hands the agent the task: no result, error or inputRequests on it."""
    status, message, _ = status_of(task)
    return {
        "resultType": "task",
        **_envelope(task),
        "status": status,
        **({"statusMessage": message} if message else {}),
    }
