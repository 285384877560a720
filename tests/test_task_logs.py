"""Issue 15 item 9: a task that expires or whose server breaks the protocol is logged, one line with its ids."""

import logging
from functools import partial

import pytest

from taskhub.mcp.client import TaskCreated
from taskhub.servers.services import create_server
from taskhub.tasks import services
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot as snapshot_any_time

pytestmark = pytest.mark.django_db

snapshot = partial(snapshot_any_time, last_updated_at="2026-07-28T10:00:01Z")


@pytest.fixture
def live(django_user_model):
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:8765/mcp", user=None)
    with_tools(server, "slow_compute", "t")
    task = services.launch(server=server, tool="slow_compute", arguments={}, user=django_user_model.objects.create())
    return services.record_launch_outcome(task=task, outcome=TaskCreated(task=snapshot(taskId="remote-7")))


def task_lines(caplog, task) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "taskhub.tasks.services" and str(task.id) in r.getMessage()
    ]


def test_an_expired_task_is_logged_once_with_its_ids_after_commit(live, caplog, django_capture_on_commit_callbacks):
    caplog.set_level(logging.WARNING, logger="taskhub.tasks.services")
    with django_capture_on_commit_callbacks() as callbacks:
        services.expire(task=live)
        assert task_lines(caplog, live) == []  # nothing before the change is committed
    for callback in callbacks:
        callback()
    with django_capture_on_commit_callbacks(execute=True):
        services.expire(task=live)  # already final: nothing happens, nothing is logged
    (line,) = task_lines(caplog, live)
    assert f"server {live.server_id}" in line and "'remote-7'" in line and "expired (was working" in line


def test_a_protocol_error_is_logged_once_with_its_ids(live, caplog, django_capture_on_commit_callbacks):
    caplog.set_level(logging.WARNING, logger="taskhub.tasks.services")
    done = snapshot("completed", taskId="remote-7", result={"content": [], "isError": False})
    contradiction = snapshot("working", taskId="remote-7", statusMessage="back from the dead")
    with django_capture_on_commit_callbacks(execute=True):
        services.apply_snapshot(task=live, snapshot=done)
        services.apply_snapshot(task=live, snapshot=contradiction)
        services.apply_snapshot(task=live, snapshot=contradiction)  # the same problem again: recorded once
    (line,) = task_lines(caplog, live)
    assert "protocol error: 'the task is completed, which is final, but the server now says otherwise'" in line
    assert "'remote-7'" in line
