"""Agent identity (issue 17): which API token launched a task, the `agents` group, the agent filters, the audit.

The subject: a server `demo` with one tool, an agent account (in `agents` only) holding a token, an operator.
"""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client

from taskhub.accounts.groups import ADMINS, AGENTS, APPROVERS, OPERATORS
from taskhub.api.models import ApiToken
from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.audit.queries import filtered_events
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, Task
from taskhub.tasks.queries import TaskFilterForm, filtered_tasks
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"]}
QUESTION = {
    "method": "elicitation/create",
    "params": {"message": "Go?", "requestedSchema": {"type": "object", "properties": {}}},
}
HOSTILE_NAME = '<script>alert("x")</script> & co'


@pytest.fixture
def server():
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:1/mcp", user=None)
    Server.objects.filter(pk=server.pk).update(tools=[{"name": "deploy", "inputSchema": SCHEMA}])
    server.refresh_from_db()
    return server


@pytest.fixture
def people():
    return {
        "agent": make_user("ci-bot", AGENTS),
        "operator": make_user("olga", OPERATORS),
        "approver": make_user("arun", APPROVERS),
        "admin": make_user("alex", ADMINS),
    }


@pytest.fixture
def bot_token(people):
    return create_token(user=people["agent"], name="nightly deploys")


def bearer(secret: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {secret}"})


def post_json(client: Client, url: str, body=None):
    response = client.post(url, data=json.dumps(body or {}), content_type="application/json")
    return response.status_code, response.json()


def agent_of(event: AuditEvent):
    return event.data.get("agent")


# --- the service ----------------------------------------------------------------------------------


def test_launch_with_a_token_records_the_agent_on_the_task_and_its_audit_row(server, people, bot_token):
    token, _ = bot_token
    task = services.launch(server=server, tool="deploy", arguments={"target": "x"}, user=people["agent"], token=token)
    task.refresh_from_db()
    assert task.launched_via_token_id == token.pk
    assert task.launched_via_label == f"nightly deploys ({token.prefix}…)"
    launched = AuditEvent.objects.get(task_id=task.pk, action="task.launched")
    assert launched.actor_label == "ci-bot"  # the actor stays the person the token acts as
    assert agent_of(launched) == {"token_id": token.pk, "name": "nightly deploys", "prefix": token.prefix}
    assert launched.agent == f"nightly deploys ({token.prefix}…)"


def test_launch_without_a_token_names_no_agent(server, people):
    task = services.launch(server=server, tool="deploy", arguments={"target": "x"}, user=people["operator"])
    assert task.launched_via_token_id is None and task.launched_via_label == ""
    launched = AuditEvent.objects.get(task_id=task.pk, action="task.launched")
    assert "agent" not in launched.data and launched.agent == ""


def test_a_deleted_token_leaves_its_label_on_the_task(server, people, bot_token):
    token, _ = bot_token
    task = services.launch(server=server, tool="deploy", arguments={"target": "x"}, user=people["agent"], token=token)
    ApiToken.objects.filter(pk=token.pk).delete()
    task.refresh_from_db()
    assert task.launched_via_token_id is None
    assert task.launched_via_label == f"nightly deploys ({token.prefix}…)"
    assert task.launched_by_agent


# --- the API --------------------------------------------------------------------------------------


def test_an_agent_launches_follows_and_cancels_its_own_task_through_the_api(server, people, bot_token):
    token, secret = bot_token
    client = bearer(secret)
    status, body = post_json(client, "/api/tasks", {"server": "demo", "tool": "deploy", "arguments": {"target": "a"}})
    assert status == 201, body
    assert body["launched_by"] == "ci-bot"
    assert body["launched_via"] == {"token_id": token.pk, "label": f"nightly deploys ({token.prefix}…)"}
    task_id = body["id"]
    assert client.get(f"/api/tasks/{task_id}").json()["launched_via"]["token_id"] == token.pk

    # Its list holds its own tasks only, and filters by agent.
    others = services.launch(server=server, tool="deploy", arguments={"target": "b"}, user=people["operator"])
    assert [row["id"] for row in client.get("/api/tasks").json()["results"]] == [task_id]
    assert client.get(f"/api/tasks?agent={token.pk}").json()["count"] == 1
    assert client.get("/api/tasks?agent=none").json()["count"] == 0
    assert client.get(f"/api/tasks/{others.pk}").status_code == 404
    assert client.post(f"/api/tasks/{others.pk}/cancel").status_code == 404

    status, body = post_json(client, f"/api/tasks/{task_id}/cancel")
    assert status == 202, body
    cancelled = AuditEvent.objects.filter(task_id=task_id, action="task.cancel_requested").get()
    assert cancelled.actor_label == "ci-bot"
    assert agent_of(cancelled)["token_id"] == token.pk


def test_an_agent_cannot_launch_on_a_disabled_server(server, bot_token):
    Server.objects.filter(pk=server.pk).update(enabled=False)
    status, body = post_json(
        bearer(bot_token[1]), "/api/tasks", {"server": "demo", "tool": "deploy", "arguments": {"target": "a"}}
    )
    assert status == 409, body
    assert not Task.objects.exists()


def test_an_operators_launch_and_an_approvers_answer_through_tokens_name_their_tokens(server, people):
    ops_token, ops_secret = create_token(user=people["operator"], name="ops script")
    status, body = post_json(
        bearer(ops_secret), "/api/tasks", {"server": "demo", "tool": "deploy", "arguments": {"target": "a"}}
    )
    assert status == 201, body
    task = Task.objects.get(pk=body["id"])
    assert task.launched_via_token_id == ops_token.pk
    base = {"taskId": "remote-1", "createdAt": "2026-07-28T10:00:00Z", "ttlMs": 600000}
    task = services.record_launch_outcome(
        task=task, outcome=TaskCreated(task=TaskSnapshot.model_validate({**base, "status": "working"}))
    )
    services.apply_snapshot(
        task=task,
        snapshot=TaskSnapshot.model_validate({**base, "status": "input_required", "inputRequests": {"q": QUESTION}}),
    )
    question = InputRequest.objects.get(task=task, key="q")
    approver_token, approver_secret = create_token(user=people["approver"], name="chatops")
    status, body = post_json(
        bearer(approver_secret), f"/api/input-requests/{question.pk}/answer", {"action": "accept", "content": {}}
    )
    assert status == 200, body
    answered = AuditEvent.objects.get(task_id=task.pk, action="input.answered")
    assert answered.actor_label == "arun"
    assert agent_of(answered) == {"token_id": approver_token.pk, "name": "chatops", "prefix": approver_token.prefix}
    # What was done by hand names no agent.
    assert "agent" not in AuditEvent.objects.get(task_id=task.pk, action="task.status_changed").data


# --- the pages ------------------------------------------------------------------------------------


@pytest.fixture
def mixed(server, people):
    """A task launched through the agent's token (a hostile name), one through the operator's, one by hand."""
    bot, _ = create_token(user=people["agent"], name=HOSTILE_NAME)
    ops, _ = create_token(user=people["operator"], name="ops script")
    launch = services.launch
    return {
        "bot": bot,
        "ops": ops,
        "by_bot": launch(server=server, tool="deploy", arguments={"target": "1"}, user=people["agent"], token=bot),
        "by_ops": launch(server=server, tool="deploy", arguments={"target": "2"}, user=people["operator"], token=ops),
        "by_hand": launch(server=server, tool="deploy", arguments={"target": "3"}, user=people["operator"]),
    }


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_task_page_says_which_agent_launched_it_escaped(people, mixed):
    page = signed_in(people["operator"]).get(f"/tasks/{mixed['by_bot'].pk}/").content.decode()
    assert "<strong>ci-bot</strong>" in page
    assert "via <strong>&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co (" in page
    assert f"{mixed['bot'].prefix}…)</strong>" in page
    assert '<script>alert("x")' not in page
    # The timeline names the agent beside the actor.
    assert "by ci-bot via &lt;script&gt;" in page
    by_hand = signed_in(people["operator"]).get(f"/tasks/{mixed['by_hand'].pk}/").content.decode()
    assert "launched-via" not in by_hand


def rows(page: str) -> set[str]:
    return {chunk.split('"', 1)[0] for chunk in page.split('id="task-row-')[1:]}


def agent_select(page: str) -> str:
    start = page.index('name="agent"')
    return page[start : page.index("</select>", start)]


def test_the_task_list_marks_agents_and_filters_by_them(people, mixed):
    client = signed_in(people["operator"])
    ids = {name: str(mixed[name].pk) for name in ("by_bot", "by_ops", "by_hand")}
    page = client.get("/tasks/").content.decode()
    assert rows(page) == set(ids.values())
    assert page.count("data-agent") == 2
    assert rows(client.get("/tasks/?agent=any").content.decode()) == {ids["by_bot"], ids["by_ops"]}
    assert rows(client.get("/tasks/?agent=none").content.decode()) == {ids["by_hand"]}
    assert rows(client.get(f"/tasks/?agent={mixed['ops'].pk}").content.decode()) == {ids["by_ops"]}

    # An operator's select offers their own tokens; someone else's is refused by name, and not applied.
    offered = agent_select(page)
    assert f'<option value="{mixed["ops"].pk}">' in offered
    assert f'<option value="{mixed["bot"].pk}">' not in offered
    refused = client.get(f"/tasks/?agent={mixed['bot'].pk}").content.decode()
    assert f"There is no API token “{mixed['bot'].pk}” among those you may see" in refused
    assert rows(refused) == set(ids.values())

    # Admins choose among every token, escaped.
    admin_page = signed_in(people["admin"]).get(f"/tasks/?agent={mixed['bot'].pk}").content.decode()
    assert rows(admin_page) == {ids["by_bot"]}
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co (" in admin_page
    assert '<script>alert("x")' not in admin_page


def test_the_agent_filter_offers_tokens_revoked_first_by_name_with_their_people_for_admins(people, mixed):
    from django.utils import timezone

    from taskhub.tasks.queries import agent_choices

    spare, _ = create_token(user=people["operator"], name="a spare")
    ApiToken.objects.filter(pk=mixed["ops"].pk).update(revoked_at=timezone.now())
    fixed = [("", "people and agents"), ("any", "launched by an agent"), ("none", "launched by a person")]

    def offered(user):
        choices = agent_choices(user)
        assert [(value, str(label)) for value, label in choices[:3]] == fixed
        return [(value, str(label)) for value, label in choices[3:]]

    def label(token, suffix=""):
        return f"{token.name} ({token.prefix}…){suffix}"

    assert offered(people["operator"]) == [
        (str(mixed["ops"].pk), label(mixed["ops"], " · revoked")),
        (str(spare.pk), label(spare)),
    ]
    assert offered(people["admin"]) == [
        (str(mixed["ops"].pk), label(mixed["ops"], " · olga · revoked")),
        (str(mixed["bot"].pk), label(mixed["bot"], " · ci-bot")),
        (str(spare.pk), label(spare, " · olga")),
    ]
    assert offered(people["approver"]) == []


@pytest.mark.parametrize(("agent", "index"), [("any", "task_agent_created"), ("token", "task_token_created")])
def test_the_agent_filters_are_served_by_their_partial_indexes(people, mixed, agent, index):
    value = str(mixed["ops"].pk) if agent == "token" else agent
    form = TaskFilterForm({"agent": value}, user=people["admin"])
    tasks, _ = filtered_tasks(form, people["admin"])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = tasks.order_by("-created_at").explain()
    assert index in plan, plan


def test_an_agent_only_account_sees_its_tokens_and_no_task_page(people, mixed):
    client = signed_in(people["agent"])
    home = client.get("/").content.decode()
    assert "An agent&#x27;s account" in home or "An agent's account" in home
    assert 'href="/tokens/"' in home
    assert client.get("/tasks/").status_code == 403
    assert client.get(f"/tasks/{mixed['by_bot'].pk}/").status_code == 404  # its own task too: that is the API's
    assert client.get("/tokens/").status_code == 200


# --- the audit page -------------------------------------------------------------------------------


def test_the_audit_page_filters_by_agent_and_names_it_escaped(people, mixed):
    client = signed_in(people["admin"])
    bot = mixed["bot"]
    page = client.get(f"/audit/?agent={bot.pk}").content.decode()
    assert "<strong>1</strong> event match" in page
    assert "via &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co (" in page
    assert '<script>alert("x")' not in page

    def launched(params: dict) -> set:
        form, events = filtered_events(params)
        assert form.is_valid(), form.errors
        return set(events.filter(action="task.launched").values_list("task_id", flat=True))

    assert launched({"agent": "any"}) == {mixed["by_bot"].pk, mixed["by_ops"].pk}
    assert launched({"agent": "none"}) == {mixed["by_hand"].pk}
    assert launched({"agent": str(mixed["ops"].pk)}) == {mixed["by_ops"].pk}
    form, events = filtered_events({"agent": "999999"})
    assert not form.is_valid() and not events.exists()

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = filtered_events({"agent": str(bot.pk)})[1].explain()
    # audit_agent_time, as each monthly partition names its copy (audit_auditevent_<month>_expr_time_idx).
    assert "_expr_time_idx" in plan and "Index Cond: ((data #>> '{agent,token_id}'" in plan, plan


def test_the_tokens_page_counts_each_tokens_tasks_and_links_them_for_who_sees_tasks(people, mixed):
    admin_page = signed_in(people["admin"]).get("/tokens/").content.decode()
    bot_row = admin_page[admin_page.index(f'id="token-{mixed["bot"].pk}"') :]
    assert f'<a href="/tasks/?agent={mixed["bot"].pk}">1</a>' in bot_row[: bot_row.index("</tr>")]
    # The agent's own account sees the count, and no link to a list it may not open.
    own = signed_in(people["agent"]).get("/tokens/").content.decode()
    cell = own[own.index('class="token-launched"') :]
    assert cell[: cell.index("</td>")] == 'class="token-launched">1'


def test_the_tasks_command_names_the_agent(mixed):
    out = StringIO()
    call_command("tasks", "--json", stdout=out)
    via = {row["id"]: row["launched_via"] for row in json.loads(out.getvalue())}
    assert via[str(mixed["by_ops"].pk)] == f"ops script ({mixed['ops'].prefix}…)"
    assert via[str(mixed["by_hand"].pk)] is None
