"""Issue 36: the audit trail records decisions, not progress ticks; it is a hash chain anyone can verify, the database
owner included; it lives in monthly partitions the owner archives and drops, the application's role never."""

from functools import partial

import pytest

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import presenters, services
from taskhub.tasks.models import ProgressMessage
from taskhub.tasks.services.progress import PROGRESS_MESSAGES_KEPT, PROGRESS_OLDER_KEPT
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot as snapshot_any_time

pytestmark = pytest.mark.django_db

snapshot = partial(snapshot_any_time, last_updated_at="2026-07-28T10:00:01Z")


@pytest.fixture
def live(django_user_model):
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    with_tools(server, "slow_compute")
    task = services.launch(server=server, tool="slow_compute", arguments={}, user=django_user_model.objects.create())
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot()))


def test_900_progress_messages_leave_a_handful_of_audit_rows_and_the_timeline_shows_the_last(live):
    for second in range(900, 0, -1):
        services.apply_snapshot(task=live, snapshot=snapshot(statusMessage=f"{second} s of 900 s"))
    services.apply_snapshot(task=live, snapshot=snapshot("completed", statusMessage="done", result={"content": []}))

    trail = list(AuditEvent.objects.filter(task_id=live.pk).order_by("id").values_list("action", "data"))
    assert len(trail) <= 10, [action for action, _ in trail]
    assert [action for action, _ in trail] == ["task.launched", "task.launch_answered", "task.status_changed"]
    assert trail[-1][1]["progress_updates"] == 900 and trail[-1][1]["to"] == "completed"

    kept = ProgressMessage.objects.filter(task_id=live.pk)
    assert kept.count() <= PROGRESS_MESSAGES_KEPT + PROGRESS_OLDER_KEPT
    assert kept.filter(text="1 s of 900 s").exists() and kept.filter(text="900 s of 900 s").exists()
    live.refresh_from_db()
    entries, _ = presenters.timeline(live)
    said = [entry.data for entry in entries if entry.action == "task.progress"]
    assert said[-3:] == ["3 s of 900 s", "2 s of 900 s", "1 s of 900 s"]
    assert entries[-1].action == "task.status_changed"

    services.purge_finished_tasks(finished_before=live.created_at.max)  # retention: the history goes with the task
    assert not ProgressMessage.objects.filter(task_id=live.pk).exists()
