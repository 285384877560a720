"""The domain's and the approval rules' signals, turned into outbox rows (connected in ApprovalsConfig.ready()).

Each signal is sent after its change committed, with send_robust: a receiver that fails is logged and undoes
nothing."""

from taskhub.approvals import signals as approval_signals
from taskhub.approvals.models import NotificationKind
from taskhub.approvals.notifications import outbox
from taskhub.servers import signals as server_signals
from taskhub.tasks import signals as task_signals


def on_input_requests_opened(sender, *, task_id, input_request_ids, **kwargs) -> None:
    outbox.record_request_events(kind=NotificationKind.REQUEST_WAITING, input_request_ids=input_request_ids)


def on_deadline_near(sender, *, input_request_id, deadline=None, **kwargs) -> None:
    detail = {"deadline": deadline.isoformat() if hasattr(deadline, "isoformat") else str(deadline or "")}
    outbox.record_request_events(
        kind=NotificationKind.DEADLINE_NEAR, input_request_ids=[input_request_id], detail=detail
    )


def on_default_applied(sender, *, input_request_id, outcome="", **kwargs) -> None:
    outbox.record_request_events(
        kind=NotificationKind.DEFAULT_APPLIED, input_request_ids=[input_request_id], detail={"outcome": str(outcome)}
    )


def on_task_finished(sender, *, task_id, status, launched_by_id, **kwargs) -> None:
    outbox.record_task_finished(task_id=task_id, status=status, launched_by_id=launched_by_id)


def on_server_needs_reauthorization(sender, *, server_id, server_name, **kwargs) -> None:
    outbox.record_server_needs_authorization(server_id=server_id, server_name=server_name)


def connect() -> None:
    task_signals.input_requests_opened.connect(on_input_requests_opened, dispatch_uid="notifications.requests")
    task_signals.task_finished.connect(on_task_finished, dispatch_uid="notifications.task_finished")
    approval_signals.deadline_near.connect(on_deadline_near, dispatch_uid="notifications.deadline_near")
    approval_signals.default_applied.connect(on_default_applied, dispatch_uid="notifications.default_applied")
    server_signals.needs_reauthorization.connect(
        on_server_needs_reauthorization, dispatch_uid="notifications.server_needs_reauthorization"
    )
