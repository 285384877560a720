"""Issue 34, item 3: one definition of each outcome, said the same way by the task list (its rows, its filter and the
live row), Home, the API and /metrics. "Declined": a person declined one of the task's questions and it then ended
(whatever the server made of the decline: the demo's `approval` completes with an ordinary result), or the gate
before the call stopped it."""

import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from taskhub.accounts.groups import ADMINS, APPROVERS
from taskhub.api.tokens import create_token
from taskhub.approvals.services import create_policy
from taskhub.live.task_fragments import list_signal
from taskhub.mcp.client import ToolCompleted
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import GATE_METHOD, InputRequest, Task
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.helpers import snapshot
from tests.inbox_fixtures import remote_id, request_of, task_asking
from tests.metrics_fixtures import parse, value

pytestmark = pytest.mark.django_db

ASK = {"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": {"type": "object"}}}
TOKEN = "a-scrape-token-of-some-length"


@pytest.fixture
def ended():
    """Three declined tasks of three kinds, and one that completed cleanly after an accepted question."""
    server = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    ada = make_user("ada", APPROVERS, ADMINS)

    def answered(action, status, **fields):
        task = task_asking(server, {"go": ASK}, tool="approval")
        services.answer_input(input_request=request_of(task, "go"), response={"action": action}, user=ada)
        services.apply_snapshot(task=task, snapshot=snapshot(status, task_id=remote_id(task), **fields))
        return task

    # The demo's approval: a decline answered with an ordinary, successful result.
    declined_then_completed = answered("decline", "completed")
    declined_then_cancelled = answered("decline", "cancelled")
    accepted = answered("accept", "completed")

    create_policy(server=server, tool="deploy", gate_before_call=True, user=None)
    gated = services.launch(server=with_tools(server, "deploy"), tool="deploy", arguments={}, user=ada)
    gate = InputRequest.objects.select_related("task__server").get(task=gated, method=GATE_METHOD)
    bob = make_user("bob", APPROVERS, ADMINS)
    services.answer_input(input_request=gate, response={"action": "decline"}, user=bob)
    plain = services.launch(server=with_tools(server, "render"), tool="render", arguments={}, user=ada)
    services.record_launch_outcome(task=plain, outcome=ToolCompleted(result={"content": []}))
    declined = {str(task.pk) for task in (declined_then_completed, declined_then_cancelled, gated)}
    return ada, declined, {str(accepted.pk), str(plain.pk)}


def outcomes_in(page: str) -> dict[str, str]:
    return dict(re.findall(r'<tr id="task-row-([0-9a-f-]+)".*?data-outcome="([a-z_]+)"', page, re.S))


def test_declined_is_one_outcome_for_the_list_its_filter_the_live_row_home_the_api_and_metrics(ended, settings):
    ada, declined, completed = ended
    client = Client()
    client.force_login(ada)

    rows = outcomes_in(client.get(reverse("tasks:list")).content.decode())
    assert {task for task, outcome in rows.items() if outcome == "declined"} == declined
    assert {task for task, outcome in rows.items() if outcome == "completed"} == completed
    assert "not approved" not in re.sub(r'title="[^"]*"|<span class="oneline[^>]*>[^<]*', "", str(rows))
    assert set(outcomes_in(client.get(reverse("tasks:list"), {"outcome": "declined"}).content.decode())) == declined
    assert set(outcomes_in(client.get(reverse("tasks:list"), {"outcome": "completed"}).content.decode())) == completed
    for task in Task.objects.filter(pk__in=declined):  # the row pushed live when a task changes
        assert 'data-outcome="declined"' in list_signal(task, ada)

    home = client.get("/").content.decode()
    assert re.search(r'data-outcome="declined">.*?<span class="dash-count">3</span>', home, re.S)
    assert re.search(r'data-outcome="completed">.*?<span class="dash-count">2</span>', home, re.S)

    _, secret = create_token(user=ada, name="tests")
    api = Client(headers={"Authorization": f"Bearer {secret}"})
    listed = {row["id"]: row["outcome"] for row in api.get("/api/tasks").json()["results"]}
    assert {task for task, outcome in listed.items() if outcome == "declined"} == declined
    assert {row["id"] for row in api.get("/api/tasks", {"outcome": "declined"}).json()["results"]} == declined
    for task in declined:
        assert api.get(f"/api/tasks/{task}").json()["outcome"] == "declined"

    settings.TASKHUB_METRICS_TOKEN, settings.TASKHUB_METRICS_ALLOWED_NETWORKS = TOKEN, []
    scraped = parse(client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode())
    assert value(scraped, "taskhub_tasks_ended_24h", outcome="declined") == 3
    assert value(scraped, "taskhub_tasks_ended_24h", outcome="completed") == 2
    assert Task.objects.filter(finished_at__lte=timezone.now()).count() == 5
