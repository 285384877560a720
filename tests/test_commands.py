"""Management commands for scripting: servers, launching, listing tasks, API tokens."""

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.audit.models import AuditEvent
from taskhub.servers.models import Server
from taskhub.tasks.models import Task
from tests.account_fixtures import make_user
from tests.helpers import free_port

pytestmark = pytest.mark.django_db


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def demo(shared_demo_server):
    return shared_demo_server


def test_add_discover_list_launch_and_list_tasks(demo, monkeypatch):
    make_user("olga", OPERATORS)
    monkeypatch.setenv("DEMO_TOKEN", "s3cret-token")
    out = run("server", "add", "demo", "--url", demo.url, "--bearer-token-env", "DEMO_TOKEN", "--discover")
    assert "added demo" in out and "discovered demo:" in out and "approval" in out
    server = Server.objects.get(name="demo")
    assert server.bearer_token == "s3cret-token"
    assert "s3cret-token" not in json.dumps(list(AuditEvent.objects.values_list("data", flat=True)))

    listed = json.loads(run("server", "list", "--json"))
    assert listed[0]["name"] == "demo" and listed[0]["health"] == "reachable" and "approval" in listed[0]["tools"]

    task_id = run("launch", "demo", "approval", "--as", "olga", "--arguments", '{"action": "ship"}').strip()
    task = Task.objects.get(pk=task_id)
    assert task.arguments == {"action": "ship"} and task.launched_by.username == "olga"
    rows = json.loads(run("tasks", "--json", "--server", "demo", "--launched-by", "olga"))
    assert [row["id"] for row in rows] == [task_id]

    run("server", "update", "demo", "--enabled", "false")
    server.refresh_from_db()
    assert not server.enabled


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("server", "add", "x", "--url", "http://127.0.0.1:1/mcp", "--bearer-token-env", "UNSET_VAR_XYZ"), "not set"),
        (("server", "add", "x", "--url", "not a url"), "Not saved"),
        (("server", "discover", "nope"), "No server"),
        (("server", "update", "nope", "--enabled", "true"), "No server"),
        (("launch", "nope", "approval", "--as", "olga"), "No server"),
        (("launch", "demo", "nope", "--as", "olga"), "no tool"),
        (("launch", "demo", "approval", "--as", "olga", "--arguments", "{bad"), "not JSON"),
        (("launch", "demo", "approval", "--as", "olga", "--arguments", '{"action": 5}'), "input schema"),
        (("launch", "demo", "approval", "--as", "arun"), "not an active operator"),
        (("create_api_token", "ghost"), "No active user"),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(demo, args, words):
    make_user("olga", OPERATORS)
    make_user("arun", APPROVERS)
    run("server", "add", "demo", "--url", demo.url, "--discover")
    with pytest.raises(CommandError, match=words):
        run(*args)
    assert not Task.objects.exists()
    assert list(Server.objects.values_list("name", flat=True)) == ["demo"]


def test_discovery_of_a_server_that_does_not_answer_fails_clearly():
    run("server", "add", "gone", "--url", f"http://127.0.0.1:{free_port()}/mcp")
    with pytest.raises(CommandError, match="Discovery of gone failed"):
        run("server", "discover", "gone")
    assert Server.objects.get(name="gone").unreachable_since is not None


def test_an_api_token_from_the_command_works_once_printed():
    make_user("olga", OPERATORS)
    secret = run("create_api_token", "olga", "--name", "ci").strip()
    assert secret.startswith("thk_")
    assert Client(headers={"Authorization": f"Bearer {secret}"}).get("/api/tasks").status_code == 200
