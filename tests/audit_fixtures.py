"""A realistic audit history made through the real services (servers, launches, snapshots) plus a few
hand-written events with hostile data, for the audit page tests and screenshots."""

from functools import partial

from django.db import transaction

from taskhub.audit.services import WORKER, record_event
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot as snapshot_any_time

SCRIPT = "<script>document.title='pwned'</script>"


snapshot = partial(snapshot_any_time, last_updated_at="2026-07-28T10:00:01Z")


def make_audit_history(admin, operator) -> dict:
    """Two servers, three tasks in different states, and events a hostile server could have caused."""
    demo = create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=admin)
    reports = create_server(name="reports", transport="stdio", command="reports-mcp", user=admin)
    with_tools(demo, "slow_compute", "needs_approval")
    with_tools(reports, "build_report")

    slow = services.launch(server=demo, tool="slow_compute", arguments={"seconds": 5}, user=operator)
    slow = services.record_launch_outcome(task=slow, outcome=TaskCreated(task=snapshot(task_id="slow-1")))
    services.apply_snapshot(
        task=slow,
        snapshot=snapshot("completed", task_id="slow-1", statusMessage="done", lastUpdatedAt="2026-07-28T10:00:09Z"),
    )

    approval = services.launch(server=demo, tool="needs_approval", arguments={"amount": 120}, user=operator)
    approval = services.record_launch_outcome(task=approval, outcome=TaskCreated(task=snapshot(task_id="appr-1")))
    services.apply_snapshot(
        task=approval,
        snapshot=snapshot(
            "failed", task_id="appr-1", statusMessage="Budget service down", lastUpdatedAt="2026-07-28T10:00:05Z"
        ),
    )

    report = services.launch(server=reports, tool="build_report", arguments={"quarter": "Q3"}, user=admin)
    report = services.record_launch_outcome(task=report, outcome=TaskCreated(task=snapshot(task_id="rep-1")))

    with transaction.atomic():
        record_event(
            action="task.protocol_error",
            actor_label=WORKER,
            task=report,
            data={"message": SCRIPT, "detail": "x" * 400},
        )
        record_event(
            action="server.unreachable",
            actor_label='=HYPERLINK("http://evil")',
            server=reports,
            data={"error": "-2+3", "note": "@SUM(A1:A9)"},
        )
    return {"demo": demo, "reports": reports, "slow": slow, "approval": approval, "report": report}
