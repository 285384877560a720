"""The MCP gateway (taskhub/gateway) through Django's test client, without a worker: who may call, what tools each
endpoint offers, how a call becomes a task, and how tasks/get|update|cancel read and write Postgres only.
The real stack (worker, demo server, conformance suite) is tests/test_gateway_stack.py's."""

import asyncio
import json

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connections
from django.test import Client, override_settings
from django.utils import timezone

from taskhub.accounts.groups import ADMINS, AGENTS, APPROVERS, OPERATORS
from taskhub.api.tokens import create_token, revoke_token
from taskhub.audit.models import AuditEvent
from taskhub.gateway import calls
from taskhub.gateway.waiting import close_gateway_connections
from taskhub.mcp.client import TaskCreated, ToolCompleted, ToolInputRequired
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest, InputRequestState, Task, TaskStatus
from taskhub.web.request_threads import ANSWERED_AT_ONCE_URLCONF, answered_at_once
from tests.account_fixtures import make_user
from tests.approval_fixtures import set_approver_groups
from tests.helpers import snapshot, wait_until

TASKS = "io.modelcontextprotocol/tasks"
DECLARING = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "extensions": {TASKS: {}}},
}
PLAIN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
# A tool as a server sent it: annotations, an output schema and x-mcp-header metadata are passed on untouched.
DEPLOY = {
    "name": "deploy",
    "title": "Deploy",
    "description": "Deploy <b>it</b>",
    "inputSchema": {
        "type": "object",
        "properties": {"target": {"type": "string", "x-mcp-header": "Target"}},
        "required": ["target"],
    },
    "annotations": {"destructiveHint": True},
    "_meta": {"vendor/x": 1},
}
SAMPLING = {
    "method": "sampling/createMessage",
    "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "Go?"}}], "maxTokens": 50},
}
QUESTION = {
    "method": "elicitation/create",
    "params": {
        "message": "Go?",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    },
}


@pytest.fixture
def world(db, settings):
    settings.TASKHUB_GATEWAY_LAUNCH_WAIT_SECONDS = 0  # no worker here: answer with the task at once
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    Server.objects.filter(pk=alpha.pk).update(tools=[DEPLOY], discovered_at=timezone.now())
    agent = make_user("agent", OPERATORS)
    token, secret = create_token(user=agent, name="agent")
    return {"server": alpha, "agent": agent, "token": secret, "token_row": token}


def agent_of(event: AuditEvent) -> int | None:
    """The API token an audit row names as the agent of what was done."""
    return (event.data.get("agent") or {}).get("token_id")


def rpc(token, method, params=None, *, path="/mcp/servers/alpha", meta=DECLARING, headers=None, request_id=1):
    """The request as an agent sends it, with its `Mcp-Method` header (unless `headers` says otherwise), routed as
    taskhub's ASGI application routes it: a method answered at once to the gateway's sync views."""
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": meta}}
    headers = {name: value for name, value in {"Mcp-Method": method, **(headers or {})}.items() if value is not None}
    client = Client(headers={**({"Authorization": f"Bearer {token}"} if token else {}), **headers})
    scope_headers = [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    urlconf = ANSWERED_AT_ONCE_URLCONF if answered_at_once(scope_headers) else settings.ROOT_URLCONF
    with override_settings(ROOT_URLCONF=urlconf):
        response = client.post(path, json.dumps(body), content_type="application/json")
    return response.status_code, response.json() if response.content else None


def remembered() -> tuple[int, int]:
    return Task.objects.count(), AuditEvent.objects.count()


@pytest.mark.parametrize("token", [None, "thk_not-a-token", "Basic abc"])
def test_without_a_valid_token_the_answer_is_401_and_nothing_is_recorded(world, token):
    before = remembered()
    status, body = rpc(token, "tools/call", {"name": "deploy", "arguments": {"target": "x"}})
    assert status == 401
    assert body["error"]["code"] == -32000 and body["id"] == 1
    assert remembered() == before


def test_a_revoked_token_is_refused_and_a_valid_one_marks_when_it_was_used(world):
    token_row = world["agent"].api_tokens.get()
    assert token_row.last_used_at is None
    assert rpc(world["token"], "ping")[0] == 200
    token_row.refresh_from_db()
    assert token_row.last_used_at is not None
    revoke_token(token=token_row)
    before = remembered()
    assert rpc(world["token"], "tools/call", {"name": "deploy", "arguments": {"target": "x"}})[0] == 401
    assert remembered() == before


def test_discover_declares_the_tasks_extension_and_tools_list_is_the_catalogue_as_sent(world):
    status, body = rpc(world["token"], "server/discover")
    assert status == 200
    assert body["result"]["capabilities"]["extensions"] == {TASKS: {}}
    assert body["result"]["capabilities"]["tools"] == {"listChanged": True}
    assert body["result"]["supportedVersions"] == ["2026-07-28"]
    status, body = rpc(world["token"], "tools/list")
    assert body["result"]["tools"] == [DEPLOY]


def test_the_aggregate_endpoint_names_tools_after_their_server_and_skips_unusable_server_names(world, caplog):
    beta = create_server(name="beta srv", transport="http", url="http://127.0.0.1:9/beta", user=None)
    Server.objects.filter(pk=beta.pk).update(tools=[DEPLOY], discovered_at=timezone.now())
    off = create_server(name="off", transport="http", url="http://127.0.0.1:9/off", user=None)
    Server.objects.filter(pk=off.pk).update(tools=[DEPLOY], enabled=False)
    _status, body = rpc(world["token"], "tools/list", path="/mcp")
    assert [tool["name"] for tool in body["result"]["tools"]] == ["alpha__deploy"]
    assert body["result"]["tools"][0]["inputSchema"] == DEPLOY["inputSchema"]
    assert "'beta srv' skipped" in caplog.text

    _status, body = rpc(
        world["token"], "tools/call", {"name": "alpha__deploy", "arguments": {"target": "x"}}, path="/mcp"
    )
    task = Task.objects.get()
    assert (task.server, task.tool, body["result"]["taskId"]) == (world["server"], "deploy", str(task.id))
    assert rpc(world["token"], "tasks/get", {"taskId": str(task.id)}, path="/mcp")[1]["result"]["taskId"] == str(
        task.id
    )


def test_a_call_is_a_launch_by_the_tokens_user_answered_with_the_task(world):
    _status, body = rpc(world["token"], "tools/call", {"name": "deploy", "arguments": {"target": "prod"}})
    task = Task.objects.get()
    assert task.launched_by == world["agent"] and task.arguments == {"target": "prod"}
    assert task.status == TaskStatus.LAUNCHING
    assert task.launched_via_token == world["token_row"] and task.launched_via_label.startswith("agent (thk_")
    launched_row = AuditEvent.objects.get(action="task.launched", actor=world["agent"], task=task)
    assert agent_of(launched_row) == world["token_row"].pk
    result = body["result"]
    assert result["resultType"] == "task" and result["taskId"] == str(task.id)
    assert result["status"] == "working" and result["statusMessage"].startswith("launching")
    assert result["createdAt"].endswith("Z") and result["ttlMs"] is None and result["pollIntervalMs"] == 1000
    assert not {"result", "error", "inputRequests", "requestState"} & set(result)


def test_bad_calls_are_refused_with_a_clear_error_and_launch_nothing(world):
    refusals = [
        ({"name": "nope", "arguments": {}}, "has no tool 'nope'"),
        ({"name": "deploy", "arguments": {"target": 5}}, "do not fit the tool's input schema"),
        ({"name": "deploy", "arguments": "x"}, "must be an object"),
    ]
    for params, message in refusals:
        _status, body = rpc(world["token"], "tools/call", params)
        assert body["error"]["code"] == -32602 and message in body["error"]["message"], body
    assert Task.objects.count() == 0


def test_only_users_who_may_launch_call_tools(world):
    approver = make_user("amy", APPROVERS)
    _, secret = create_token(user=approver, name="amy")
    assert rpc(secret, "tools/list")[1]["result"]["tools"] == []
    status, body = rpc(secret, "tools/call", {"name": "deploy", "arguments": {"target": "x"}})
    assert status == 403 and body["error"]["code"] == -32001
    assert Task.objects.count() == 0

    # An account of the agents group (no page roles) calls tools through its token.
    robot = make_user("robot", AGENTS)
    _, robot_secret = create_token(user=robot, name="robot")
    assert [tool["name"] for tool in rpc(robot_secret, "tools/list")[1]["result"]["tools"]] == ["deploy"]
    _status, body = rpc(robot_secret, "tools/call", {"name": "deploy", "arguments": {"target": "x"}})
    assert body["result"]["taskId"] == str(Task.objects.get(launched_by=robot).id)


def test_routing_headers_must_match_the_body(world):
    status, body = rpc(world["token"], "tools/call", {"name": "deploy"}, headers={"Mcp-Method": "tasks/get"})
    assert (status, body["error"]["code"]) == (400, -32020)
    status, body = rpc(
        world["token"], "tasks/get", {"taskId": "a"}, headers={"Mcp-Method": "tasks/get", "Mcp-Name": "b"}
    )
    assert (status, body["error"]["code"]) == (400, -32020)
    assert Task.objects.count() == 0


def test_requests_need_their_meta_and_tasks_methods_need_the_extension(world):
    status, body = rpc(world["token"], "tools/list", meta={})
    assert (status, body["error"]["code"]) == (400, -32602)
    for method in ("tasks/get", "tasks/cancel"):
        status, body = rpc(world["token"], method, {"taskId": "x"}, meta=PLAIN)
        assert body["error"]["code"] == -32021
        assert body["error"]["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
    for method in ("tasks/result", "tasks/list", "resources/list"):
        assert rpc(world["token"], method)[1]["error"]["code"] == -32601


def launched(world, *, user=None, outcome=None) -> Task:
    task = services.launch(
        server=world["server"], tool="deploy", arguments={"target": "x"}, user=user or world["agent"]
    )
    if outcome is not None:
        task = services.record_launch_outcome(task=task, outcome=outcome)
    return task


def get(world, task, token=None):
    return rpc(token or world["token"], "tasks/get", {"taskId": str(task.id)})[1]


def test_tasks_get_shows_only_the_agents_own_tasks(world):
    operator = make_user("olga", OPERATORS)
    theirs = launched(world, user=operator)
    assert get(world, theirs)["error"] == {"code": -32602, "message": "Failed to retrieve task: Task not found"}
    assert rpc(world["token"], "tasks/get", {"taskId": "not-a-uuid"})[1]["error"]["code"] == -32602
    mine = launched(world)
    assert get(world, mine)["result"]["taskId"] == str(mine.id)
    other = create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=None)
    assert rpc(world["token"], "tasks/get", {"taskId": str(mine.id)}, path=f"/mcp/servers/{other.name}")[1]["error"]


def test_statuses_map_onto_the_wire(world):
    completed = launched(world, outcome=ToolCompleted(result={"content": [{"type": "text", "text": "ok"}]}))
    answer = get(world, completed)["result"]
    assert answer["status"] == "completed" and answer["result"]["content"][0]["text"] == "ok"
    assert answer["resultType"] == "complete"

    failing = launched(world, outcome=TaskCreated(task=snapshot("working")))
    services.apply_snapshot(task=failing, snapshot=snapshot("failed", error={"code": -32603, "message": "boom"}))
    answer = get(world, failing)["result"]
    assert answer["status"] == "failed" and answer["error"] == {"code": -32603, "message": "boom"}

    lost = launched(world, outcome=TaskCreated(task=snapshot("working", task_id="r2")))
    Task.objects.filter(pk=lost.pk).update(status=TaskStatus.LOST, status_message="")
    answer = get(world, lost)["result"]
    assert answer["status"] == "failed" and answer["error"]["message"].startswith("lost")

    Task.objects.filter(pk=completed.pk).update(status=TaskStatus.LAUNCH_UNKNOWN)
    assert get(world, completed)["result"]["status"] == "failed"


def test_input_without_a_policy_is_the_agents_to_answer_and_its_answer_is_audited(world):
    task = launched(world, outcome=TaskCreated(task=snapshot("working")))
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", inputRequests={"go": QUESTION}))
    answer = get(world, task)["result"]
    assert answer["status"] == "input_required" and answer["inputRequests"] == {"go": QUESTION}

    _status, body = rpc(
        world["token"],
        "tasks/update",
        {
            "taskId": str(task.id),
            "inputResponses": {"go": {"action": "accept", "content": {"ok": True, "x": 1}}, "zz": {}},
        },
    )
    assert body["result"] == {"resultType": "complete"}
    request = InputRequest.objects.get(task=task, key="go")
    assert request.state == InputRequestState.ANSWERED and request.answered_by == world["agent"]
    assert request.answer == {"action": "accept", "content": {"ok": True}}  # a field not asked for is dropped
    answered = AuditEvent.objects.get(action="input.answered", actor=world["agent"], task=task)
    assert agent_of(answered) == world["token_row"].pk
    assert get(world, task)["result"]["status"] == "working"  # the answer is on its way


def test_an_answer_that_does_not_fit_is_refused_and_changes_nothing(world):
    task = launched(world, outcome=TaskCreated(task=snapshot("working")))
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", inputRequests={"go": QUESTION}))
    _status, body = rpc(
        world["token"], "tasks/update", {"taskId": str(task.id), "inputResponses": {"go": {"action": "maybe"}}}
    )
    assert body["error"]["code"] == -32602
    assert InputRequest.objects.get(task=task, key="go").state == InputRequestState.OPEN


def test_with_a_policy_people_answer_and_the_agent_sees_working(world):
    set_approver_groups(world["server"], [Group.objects.create(name="deployers")])
    task = launched(world, outcome=TaskCreated(task=snapshot("working")))
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", inputRequests={"go": QUESTION}))
    answer = get(world, task)["result"]
    assert answer["status"] == "working" and answer["statusMessage"].startswith("waiting for approvers of ")
    assert "inputRequests" not in answer
    rpc(world["token"], "tasks/update", {"taskId": str(task.id), "inputResponses": {"go": {"action": "accept"}}})
    assert InputRequest.objects.get(task=task, key="go").state == InputRequestState.OPEN


def test_mrtr_input_is_passed_through_and_the_retry_answers_the_round(world):
    task = launched(world, outcome=ToolInputRequired(input_requests={"name": QUESTION}, request_state="upstream"))
    launched_call = calls.Launched(task_id=task.id, declared=True, after_round=0)
    reply = calls.call_answer(launched_call, world["agent"])
    assert reply["resultType"] == "input_required" and reply["inputRequests"] == {"name": QUESTION}
    assert "upstream" not in reply["requestState"]
    retry = {
        "name": "deploy",
        "arguments": {"target": "x"},
        "inputResponses": {"name": {"action": "accept", "content": {"ok": True}}},
        "requestState": reply["requestState"],
    }
    _status, body = rpc(world["token"], "tools/call", retry)
    assert body["result"]["taskId"] == str(task.id)
    assert InputRequest.objects.get(task=task, key="name").answered_by == world["agent"]

    forged = {**retry, "requestState": reply["requestState"][:-2] + "xx"}
    assert rpc(world["token"], "tools/call", forged)[1]["error"]["code"] == -32602


def test_cancel_goes_through_the_cancel_service_and_a_finished_task_is_acknowledged(world):
    task = launched(world, outcome=TaskCreated(task=snapshot("working")))
    assert rpc(world["token"], "tasks/cancel", {"taskId": str(task.id)})[1]["result"] == {"resultType": "complete"}
    task.refresh_from_db()
    assert task.cancel_requested_by == world["agent"]
    assert agent_of(AuditEvent.objects.get(action="task.cancel_requested", task=task)) == world["token_row"].pk
    done = launched(world, outcome=ToolCompleted(result={"content": []}))
    assert rpc(world["token"], "tasks/cancel", {"taskId": str(done.id)})[1]["result"] == {"resultType": "complete"}


def test_a_gated_tool_needs_the_extension(world):
    policy = set_approver_groups(world["server"], [Group.objects.create(name="deployers")])
    type(policy).objects.filter(pk=policy.pk).update(gate_before_call=True)
    _status, body = rpc(world["token"], "tools/call", {"name": "deploy", "arguments": {"target": "x"}}, meta=PLAIN)
    assert body["error"]["code"] == -32021 and Task.objects.count() == 0
    _status, body = rpc(world["token"], "tools/call", {"name": "deploy", "arguments": {"target": "x"}})
    assert body["result"]["statusMessage"].startswith("waiting for approval before the call")


def sse_messages(chunk: bytes) -> list[dict]:
    return [json.loads(line[len(b"data: ") :]) for line in chunk.splitlines() if line.startswith(b"data: ")]


async def discovered_alpha() -> Server:
    """The server alpha, its catalogue discovered (the listen tests' own, in their transactional database)."""
    from asgiref.sync import sync_to_async

    alpha = await sync_to_async(create_server)(name="alpha", transport="http", url="http://127.0.0.1:9/a", user=None)
    await Server.objects.filter(pk=alpha.pk).aupdate(tools=[DEPLOY], discovered_at=timezone.now())
    return alpha


async def a_working_task(alpha: Server, user) -> Task:
    """`user`'s deploy on alpha, followed as a working task of the server's."""
    from asgiref.sync import sync_to_async

    task = await sync_to_async(services.launch)(server=alpha, tool="deploy", arguments={"target": "x"}, user=user)
    return await sync_to_async(services.record_launch_outcome)(task=task, outcome=TaskCreated(task=snapshot("working")))


async def listen(secret: str, notifications: dict, *, request_id: str, path: str = "/mcp/servers/alpha"):
    """`subscriptions/listen` through the gateway: the streaming response."""
    from django.test import AsyncClient

    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "subscriptions/listen",
        "params": {"notifications": notifications, "_meta": DECLARING},
    }
    # AsyncClient(headers=...) does not reach an ASGI scope: the header goes with the request.
    return await AsyncClient().post(
        path, json.dumps(body), content_type="application/json", headers={"Authorization": f"Bearer {secret}"}
    )


@pytest.mark.django_db(transaction=True)
async def test_listen_streams_the_agents_tasks_changes_from_postgres_and_ends_when_they_end(settings):
    from asgiref.sync import sync_to_async

    alpha = await discovered_alpha()
    agent = await sync_to_async(make_user)("agent", OPERATORS)
    other = await sync_to_async(make_user)("olga", OPERATORS)
    _, secret = await sync_to_async(create_token)(user=agent, name="agent")
    task = await a_working_task(alpha, agent)
    theirs = await sync_to_async(services.launch)(server=alpha, tool="deploy", arguments={"target": "x"}, user=other)

    response = await listen(secret, {"taskIds": [str(task.pk), str(theirs.pk), "nope"]}, request_id="listen-1")
    assert response["Content-Type"] == "text/event-stream", response.content
    stream = aiter(response.streaming_content)
    (ack,) = sse_messages(await anext(stream))
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"taskIds": [str(task.pk)]}  # only the agent's own task is granted
    assert ack["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": "listen-1"}
    (now,) = sse_messages(await anext(stream))
    assert now["method"] == "notifications/tasks" and now["params"]["status"] == "working"

    done = snapshot("completed", result={"content": [{"type": "text", "text": "done"}], "isError": False})
    await sync_to_async(services.apply_snapshot)(task=task, snapshot=done)
    (changed,) = sse_messages(await asyncio.wait_for(anext(stream), 10))
    assert changed["params"]["status"] == "completed" and changed["params"]["result"]["content"][0]["text"] == "done"
    assert "resultType" not in changed["params"]
    (ended,) = sse_messages(await asyncio.wait_for(anext(stream), 10))
    assert ended == {
        "jsonrpc": "2.0",
        "id": "listen-1",
        "result": {"resultType": "complete", "_meta": {"io.modelcontextprotocol/subscriptionId": "listen-1"}},
    }
    await sync_to_async(connections.close_all)()  # the sync_to_async thread's, or the test database stays in use
    await sync_to_async(close_gateway_connections)()  # and the gateway pool's threads'


def listen_scope(secret: str, path: str = "/mcp/servers/alpha") -> dict:
    """An ASGI HTTP scope as daphne makes it, for a `subscriptions/listen` POST with its routing header."""
    headers = {"host": "testserver", "content-type": "application/json", "authorization": f"Bearer {secret}"}
    headers["mcp-method"] = "subscriptions/listen"
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }


@pytest.mark.django_db(transaction=True)
async def test_under_daphnes_application_a_stream_is_sent_after_its_request_and_ends_when_the_agent_leaves():
    """taskhub.asgi's HTTP application (KeptRequestThreads, OneTripHandler): the request finishes and its kept thread
    is free before the stream's first event; the agent leaving ends the stream and frees its slot."""
    from asgiref.sync import sync_to_async
    from asgiref.testing import ApplicationCommunicator
    from django.core.signals import request_finished

    from taskhub.gateway import waiting
    from taskhub.web.request_threads import KeptRequestThreads, OneTripHandler

    alpha = await discovered_alpha()
    agent = await sync_to_async(make_user)("agent", OPERATORS)
    _, secret = await sync_to_async(create_token)(user=agent, name="agent")
    task = await a_working_task(alpha, agent)
    application = KeptRequestThreads(OneTripHandler())
    finished = []

    def on_finished(**kwargs) -> None:
        finished.append(kwargs)

    request_finished.connect(on_finished)
    try:
        body = {
            "jsonrpc": "2.0",
            "id": "listen-1",
            "method": "subscriptions/listen",
            "params": {"notifications": {"taskIds": [str(task.pk)]}, "_meta": DECLARING},
        }
        agent_side = ApplicationCommunicator(application, listen_scope(secret))
        await agent_side.send_input({"type": "http.request", "body": json.dumps(body).encode()})
        head = await agent_side.receive_output(10)
        assert head["type"] == "http.response.start" and head["status"] == 200, head
        assert (b"Content-Type", b"text/event-stream") in head["headers"]
        (ack,) = sse_messages((await agent_side.receive_output(10))["body"])
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert finished  # Django finished the request before the stream's first event
        # and its kept thread goes back to wait for other requests (once it has run what the request left on it).
        kept = application.idle_answering_at_once
        await asyncio.to_thread(wait_until, lambda: kept, what="the request's thread kept", timeout=5)
        (now,) = sse_messages((await agent_side.receive_output(10))["body"])
        assert now["params"]["taskId"] == str(task.pk) and now["params"]["status"] == "working"
        assert waiting.open_slots() == 1

        await sync_to_async(services.apply_snapshot)(task=task, snapshot=snapshot("working", statusMessage="half"))
        changed = await agent_side.receive_output(10)
        assert sse_messages(changed["body"])[0]["params"]["statusMessage"] == "half" and changed["more_body"]

        await agent_side.send_input({"type": "http.disconnect"})
        await agent_side.wait(10)  # the application returns: the stream ended with the agent
        assert waiting.open_slots() == 0
    finally:
        request_finished.disconnect(on_finished)
        await sync_to_async(application.close_connections)()
        await sync_to_async(connections.close_all)()
        await sync_to_async(close_gateway_connections)()


def test_the_endpoints_server_is_read_in_one_statement_as_the_orm_reads_it(world, django_assert_num_queries):
    """catalogue.live_server_named, the server every tools/call reads: the same instance as live_servers() gives
    (its encrypted fields decrypted), and nothing for a server disabled, removed or unknown."""
    from taskhub.gateway.catalogue import live_server_named, live_servers

    alpha = world["server"]
    Server.objects.filter(pk=alpha.pk).update(headers={"X-Key": "secret"}, bearer_token="tok")
    with django_assert_num_queries(1):
        read = live_server_named("alpha")
    from_orm = live_servers().get(name="alpha")
    for field in Server._meta.concrete_fields:
        assert getattr(read, field.attname) == getattr(from_orm, field.attname), field.name
    assert read.headers == {"X-Key": "secret"} and read.bearer_token == "tok" and read._state.adding is False
    assert live_server_named("nobody") is None
    Server.objects.filter(pk=alpha.pk).update(enabled=False)
    assert live_server_named("alpha") is None
    Server.objects.filter(pk=alpha.pk).update(enabled=True, removed_at=timezone.now())
    assert live_server_named("alpha") is None


def test_a_tools_call_checks_its_token_and_launches_in_one_trip_to_the_gateways_pool(world, monkeypatch):
    """The token's read and the launch share a trip from the request's loop (each had one of its own: a thread hop
    there and back of every call); a bad token still gets its 401 before anything is recorded."""
    from taskhub.gateway import waiting

    trips: list[str] = []
    in_turn = waiting.in_turn

    async def counted(function, *args):
        trips.append(function.__name__)
        return await in_turn(function, *args)

    monkeypatch.setattr(waiting, "in_turn", counted)
    status, body = rpc(world["token"], "tools/call", {"name": "deploy", "arguments": {"target": "x"}})
    assert status == 200 and body["result"]["resultType"] == "task"
    assert trips == ["_launch_for_token", "launch_settled", "call_answer"]
    assert Task.objects.get().launched_via_token == world["token_row"]
    before = remembered()
    assert rpc("thk_not-a-token", "tools/call", {"name": "deploy", "arguments": {"target": "x"}})[0] == 401
    assert remembered() == before


@pytest.mark.django_db(transaction=True)
async def test_an_agent_that_leaves_while_its_call_is_launched_gets_its_slot_back_once_the_launch_is_done(monkeypatch):
    """The slot is taken on the gateway's pool with the launch: an agent that hangs up meanwhile (Django cancels the
    view) must not leave it taken, or its token would be refused at the cap after twenty such calls."""
    import threading

    from asgiref.sync import sync_to_async
    from asgiref.testing import ApplicationCommunicator

    from taskhub.gateway import waiting
    from taskhub.web.request_threads import KeptRequestThreads, OneTripHandler

    await discovered_alpha()
    agent = await sync_to_async(make_user)("agent", OPERATORS)
    _, secret = await sync_to_async(create_token)(user=agent, name="agent")
    launching, go_on = threading.Event(), threading.Event()
    call_tool = calls.call_tool

    def held_call_tool(*args):
        launching.set()
        go_on.wait(10)
        return call_tool(*args)

    monkeypatch.setattr(calls, "call_tool", held_call_tool)
    application = KeptRequestThreads(OneTripHandler())
    scope = listen_scope(secret)
    scope["headers"] = [(n, b"tools/call" if n == b"mcp-method" else v) for n, v in scope["headers"]]
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "deploy", "arguments": {"target": "x"}, "_meta": DECLARING},
    }
    try:
        agent_side = ApplicationCommunicator(application, scope)
        await agent_side.send_input({"type": "http.request", "body": json.dumps(body).encode()})
        await asyncio.to_thread(launching.wait, 10)
        assert waiting.open_slots() == 1
        await agent_side.send_input({"type": "http.disconnect"})
        await agent_side.wait(10)  # the view cancelled: the application returns while the launch goes on
        go_on.set()
        await asyncio.to_thread(wait_until, lambda: waiting.open_slots() == 0, what="the slot given back", timeout=10)
        assert await Task.objects.filter(launched_by=agent).acount() == 1  # launched all the same
    finally:
        go_on.set()
        await sync_to_async(application.close_connections)()
        await sync_to_async(connections.close_all)()
        await sync_to_async(close_gateway_connections)()


@pytest.mark.django_db(transaction=True)
async def test_a_change_no_message_told_of_reaches_the_stream_through_the_processs_safety_net(monkeypatch):
    """Channel messages are at-most-once: one look per process (not per stream) finds the change and wakes the
    streams of that task only."""
    from asgiref.sync import sync_to_async

    from taskhub.gateway import waiting

    monkeypatch.setattr(waiting, "SAFETY_NET_SECONDS", 0.2)
    looks = []
    changed_since = waiting._changed_since
    monkeypatch.setattr(waiting, "_changed_since", lambda *args: looks.append(args) or changed_since(*args))
    alpha = await discovered_alpha()
    agent = await sync_to_async(make_user)("agent", OPERATORS)
    _, secret = await sync_to_async(create_token)(user=agent, name="agent")
    task = await a_working_task(alpha, agent)

    async def listening(request_id: str):
        response = await listen(secret, {"taskIds": [str(task.pk)]}, request_id=request_id)
        stream = aiter(response.streaming_content)
        (_ack,) = sse_messages(await anext(stream))
        (now,) = sse_messages(await anext(stream))
        assert "statusMessage" not in now["params"]
        return stream

    streams = [await listening("a"), await listening("b")]
    following = [asyncio.ensure_future(anext(stream)) for stream in streams]
    # Written without the service, so no message goes out: only the safety net can find it.
    await Task.objects.filter(pk=task.pk).aupdate(status_message="found by the net", updated_at=timezone.now())
    for future in following:
        (changed,) = sse_messages(await asyncio.wait_for(future, 10))
        assert changed["params"]["statusMessage"] == "found by the net"
    assert looks and all(len(args[0]) == 1 for args in looks)  # one look for both streams, at their one task
    for stream in streams:
        await stream.aclose()
    await sync_to_async(connections.close_all)()
    await sync_to_async(close_gateway_connections)()


@pytest.mark.django_db(transaction=True)
async def test_a_tools_listener_hears_of_a_server_disabled_at_once_not_at_the_safety_net(monkeypatch):
    from asgiref.sync import sync_to_async
    from channels.layers import get_channel_layer

    from taskhub.gateway import views, waiting
    from taskhub.live.groups import CATALOGUE_GROUP
    from taskhub.live.hub import hub_for
    from taskhub.servers.services import update_server

    alpha = await discovered_alpha()
    admin = await sync_to_async(make_user)("ada", ADMINS)
    agent = await sync_to_async(make_user)("agent", OPERATORS)
    _, secret = await sync_to_async(create_token)(user=agent, name="agent")
    # The stream reads what it compares changes with slowly (a loaded machine): a change made once the stream is
    # acknowledged is heard all the same. (It was missed when the acknowledgement came before that read: CI, once.)
    read_state = views._read_state

    async def slowly(*args, **kwargs):
        await asyncio.sleep(0.3)
        return await read_state(*args, **kwargs)

    monkeypatch.setattr(views, "_read_state", slowly)
    response = await listen(secret, {"toolsListChanged": True}, request_id="tools-1", path="/mcp")
    assert response["Content-Type"] == "text/event-stream", response.content
    stream = aiter(response.streaming_content)
    (ack,) = sse_messages(await anext(stream))
    assert ack["method"] == "notifications/subscriptions/acknowledged"

    # The test client runs the stream only while it is read: read on, until it listens.
    following = asyncio.ensure_future(anext(stream))
    hub = hub_for(get_channel_layer())
    while not hub.members.get(CATALOGUE_GROUP):
        await asyncio.sleep(0.01)
    server = await Server.objects.aget(pk=alpha.pk)
    await sync_to_async(update_server)(server=server, user=admin, enabled=False)
    # Within a fraction of the safety net's re-read: woken by the server's change, not by the clock.
    (changed,) = sse_messages(await asyncio.wait_for(following, waiting.SAFETY_NET_SECONDS / 3))
    assert changed["method"] == "notifications/tools/list_changed"
    await stream.aclose()
    await sync_to_async(connections.close_all)()
    await sync_to_async(close_gateway_connections)()


def _revoke(agent, token_row):
    from taskhub.api.tokens import revoke_token

    revoke_token(token=token_row, revoked_by=None)


def _deactivate(agent, token_row):
    agent.is_active = False
    agent.save()


def _take_the_role(agent, token_row):
    agent.groups.clear()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_revoke, "the API token was revoked"),
        (_deactivate, "the token's user was deactivated"),
        (_take_the_role, "the token's user is no longer an agent or an operator"),
    ],
)
@pytest.mark.django_db(transaction=True)
async def test_an_open_listen_stream_ends_within_two_seconds_once_its_token_may_no_longer_listen(change, why):
    """Issue 31, point 6: a revoked token's stream ran on for its 600 s (13 more updates in 12 s)."""
    from asgiref.sync import sync_to_async
    from channels.layers import get_channel_layer

    from taskhub.api.models import ApiToken
    from taskhub.live.groups import user_group
    from taskhub.live.hub import hub_for

    alpha = await discovered_alpha()
    agent = await sync_to_async(make_user)("agent", OPERATORS)
    token_row, secret = await sync_to_async(create_token)(user=agent, name="agent")
    task = await a_working_task(alpha, agent)
    response = await listen(secret, {"taskIds": [str(task.pk)]}, request_id="listen-1")
    stream = aiter(response.streaming_content)
    sse_messages(await anext(stream))  # the acknowledgement
    sse_messages(await anext(stream))  # the task as it is
    following = asyncio.ensure_future(anext(stream))
    hub = hub_for(get_channel_layer())
    while not hub.members.get(user_group(agent.pk)):  # the stream listens
        await asyncio.sleep(0.01)
    token_row = await ApiToken.objects.select_related("user").aget(pk=token_row.pk)
    await sync_to_async(change)(agent, token_row)
    (ended,) = sse_messages(await asyncio.wait_for(following, 2))
    assert ended["id"] == "listen-1" and ended["error"]["code"] == -32000, ended  # Unauthorized
    assert why in ended["error"]["message"]
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 2)
    await sync_to_async(connections.close_all)()
    await sync_to_async(close_gateway_connections)()


@pytest.mark.django_db
def test_listening_to_tasks_needs_the_extension(world):
    _status, body = rpc(world["token"], "subscriptions/listen", {"notifications": {"taskIds": []}}, meta=PLAIN)
    assert body["error"]["code"] == -32021


def test_a_policy_may_pass_requests_to_the_agent_whatever_it_says_about_people(world):
    policy = set_approver_groups(world["server"], [Group.objects.create(name="deployers")])  # no self-approval
    type(policy).objects.filter(pk=policy.pk).update(input_from="agent")
    task = launched(world, outcome=TaskCreated(task=snapshot("working")))
    services.apply_snapshot(task=task, snapshot=snapshot("input_required", inputRequests={"go": QUESTION}))
    assert get(world, task)["result"]["inputRequests"] == {"go": QUESTION}
    answer = {"taskId": str(task.id), "inputResponses": {"go": {"action": "accept", "content": {"ok": True}}}}
    assert rpc(world["token"], "tasks/update", answer)[1]["result"] == {"resultType": "complete"}
    request = InputRequest.objects.get(task=task, key="go")
    assert request.state == InputRequestState.ANSWERED and request.answered_by == world["agent"]
    answered = AuditEvent.objects.get(action="input.answered", task=task)
    assert answered.data["answered_as"] == "agent" and answered.actor == world["agent"]


def test_malformed_requests_get_json_rpc_errors_and_change_nothing(world):
    client = Client(headers={"Authorization": f"Bearer {world['token']}"})
    url = "/mcp/servers/alpha"
    before = remembered()
    nested = "[" * 100_000 + "]" * 100_000
    cases = [
        (b"{not json", 400, -32700),
        (nested.encode(), 400, -32700),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', 400, -32600),  # no batches any more
        (b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}', 400, -32602),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}, "pad": "' + b"x" * 1_100_000 + b'"}',
            413,
            -32600,
        ),
    ]
    for payload, status, code in cases:
        response = client.post(url, payload, content_type="application/json")
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), payload[:80]
    assert client.get(url).status_code == 405
    notification = b'{"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}}'
    assert client.post(url, notification, content_type="application/json").status_code == 202
    assert remembered() == before


@pytest.mark.parametrize("cap", ["TASKHUB_GATEWAY_STREAMS_PER_TOKEN", "TASKHUB_GATEWAY_STREAMS_TOTAL"])
def test_past_a_cap_on_open_streams_and_waits_a_call_is_refused_naming_it_and_nothing_is_recorded(world, settings, cap):
    setattr(settings, cap, 0)
    before = remembered()
    status, body = rpc(world["token"], "tools/call", {"name": "deploy", "arguments": {"target": "x"}})
    assert status == 429 and body["error"]["code"] == -32002
    assert cap in body["error"]["message"] and body["error"]["data"] == {"cap": cap, "limit": 0}
    status, body = rpc(world["token"], "subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    assert status == 429 and body["error"]["data"]["cap"] == cap
    assert remembered() == before
    setattr(settings, cap, 1)  # the refused ones took no slot
    assert rpc(world["token"], "tools/call", {"name": "deploy", "arguments": {"target": "x"}})[0] == 200


def test_a_question_asked_in_the_middle_of_the_call_is_the_agents_to_answer_unless_people_answer(world):
    """Issue 32 item 6: a classic elicitation of the upstream server (held by the worker holding the call) is an
    input_required task to the agent, answered with tasks/update and handed to the worker, not to a delivery job;
    with an approval policy on the tool, people answer it and the agent sees working."""
    from procrastinate.contrib.django.models import ProcrastinateJob

    from taskhub.tasks.services import held_questions

    _, created = rpc(world["token"], "tools/call", {"name": "deploy", "arguments": {"target": "prod"}})
    task_id = created["result"]["taskId"]
    held_questions.open_held_question(
        task_id=task_id, method=QUESTION["method"], params=QUESTION["params"], server_request_id=7, held_by="w1"
    )
    _, seen = rpc(world["token"], "tasks/get", {"taskId": task_id})
    assert seen["result"]["status"] == "input_required"
    assert seen["result"]["inputRequests"] == {"call:7": QUESTION}

    ProcrastinateJob.objects.all().delete()
    _, acknowledged = rpc(
        world["token"],
        "tasks/update",
        {"taskId": task_id, "inputResponses": {"call:7": {"action": "accept", "content": {"ok": True}}}},
    )
    assert acknowledged["result"] == {"resultType": "complete"}
    request = InputRequest.objects.get(task_id=task_id, key="call:7")
    assert request.state == InputRequestState.ANSWERED and request.answer["content"] == {"ok": True}
    assert not ProcrastinateJob.objects.exists()  # the worker holding the call sends it, woken by NOTIFY
    _, seen = rpc(world["token"], "tasks/get", {"taskId": task_id})
    assert seen["result"]["status"] == "working"

    # The upstream server's sampling request in the middle of the call: the agent writes the model's reply.
    held_questions.open_held_question(
        task_id=task_id, method=SAMPLING["method"], params=SAMPLING["params"], server_request_id=9, held_by="w1"
    )
    _, seen = rpc(world["token"], "tasks/get", {"taskId": task_id})
    assert seen["result"]["inputRequests"] == {"call:9": SAMPLING}
    reply = {"role": "assistant", "content": {"type": "text", "text": "Yes."}, "model": "the agent"}
    _, acknowledged = rpc(world["token"], "tasks/update", {"taskId": task_id, "inputResponses": {"call:9": reply}})
    assert acknowledged["result"] == {"resultType": "complete"}
    request = InputRequest.objects.get(task_id=task_id, key="call:9")
    assert request.state == InputRequestState.ANSWERED and request.answer == reply
    assert not ProcrastinateJob.objects.exists()

    from taskhub.approvals import services as policy_services

    policy_services.create_policy(server=world["server"], tool="deploy", user=None)
    held_questions.open_held_question(
        task_id=task_id, method=QUESTION["method"], params=QUESTION["params"], server_request_id=8, held_by="w1"
    )
    _, seen = rpc(world["token"], "tasks/get", {"taskId": task_id})
    assert seen["result"]["status"] == "working"
    assert seen["result"]["statusMessage"].startswith("waiting for approvers of ")


@pytest.mark.django_db(transaction=True)
def test_committed_first_runs_the_services_body_in_its_own_transaction_and_its_hook_first():
    """The gateway's launch and its record (sending.committed_first): the service's body in one transaction, with no
    savepoint of its own; `then` runs as it commits, before the service's own hooks; an error rolls the whole back."""
    from django.contrib.auth.models import User
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from taskhub.gateway.sending import committed_first

    order = []

    @transaction.atomic
    def service(*, name):
        transaction.on_commit(lambda: order.append("the service's hook"))
        return make_user(name)

    with CaptureQueriesContext(connection) as queries:
        made = committed_first(lambda user: order.append(f"then {user.username}"), service, name="ulla")
    assert order == ["then ulla", "the service's hook"] and User.objects.filter(pk=made.pk).exists()
    assert not [query for query in queries.captured_queries if "SAVEPOINT" in query["sql"]]

    @transaction.atomic
    def failing():
        make_user("una")
        raise ValueError("refused")

    with pytest.raises(ValueError):
        committed_first(lambda _: order.append("never"), failing)
    assert not User.objects.filter(username="una").exists() and "never" not in order
