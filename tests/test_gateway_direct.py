"""taskhub.gateway.direct: a plain `tasks/get` is answered beside Django's handler, and answered exactly as Django's
path answers it (status, body, headers); every other request, refused or unusual, goes to Django as before.

Each request is sent twice through taskhub's ASGI HTTP application over a real database: once as daphne serves it
(with the direct answer) and once with Django alone, and the two answers are compared."""

import asyncio
import datetime
import json

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.utils import timezone
from prometheus_client import REGISTRY

from taskhub.accounts.groups import OPERATORS
from taskhub.api.models import ApiToken
from taskhub.api.tokens import create_token, revoke_token
from taskhub.gateway import direct
from taskhub.mcp.client import TaskCreated, ToolCompleted
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import Task, TaskStatus
from taskhub.web.request_threads import KeptRequestThreads, OneTripHandler
from tests.account_fixtures import make_user
from tests.helpers import snapshot

TASKS = "io.modelcontextprotocol/tasks"
DECLARING = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
}
# What differs between two answers to one request whatever answered it.
VOLATILE_HEADERS = {b"date", b"server"}


def make_world() -> dict:
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    beta = create_server(name="beta", transport="http", url="http://127.0.0.1:9/beta", user=None)
    Server.objects.filter(pk__in=[alpha.pk, beta.pk]).update(tools=[{"name": "deploy"}], discovered_at=timezone.now())
    agent = make_user("agent", OPERATORS)
    olga = make_user("olga", OPERATORS)

    def launched(user=agent, outcome=None, server=alpha) -> Task:
        task = services.launch(server=server, tool="deploy", arguments={"target": "<x>"}, user=user)
        return task if outcome is None else services.record_launch_outcome(task=task, outcome=outcome)

    working = launched(outcome=TaskCreated(task=snapshot("working", task_id="r-working")))
    completed = launched(outcome=ToolCompleted(result={"content": [{"type": "text", "text": "ok <b>é</b>"}]}))
    failing = launched(outcome=TaskCreated(task=snapshot("working", task_id="r-failed")))
    services.apply_snapshot(
        task=failing, snapshot=snapshot("failed", task_id="r-failed", error={"code": -32603, "message": "boom"})
    )
    lost = launched(outcome=TaskCreated(task=snapshot("working", task_id="r-lost")))
    Task.objects.filter(pk=lost.pk).update(status=TaskStatus.LOST, status_message="")
    ended = {}
    for status in (TaskStatus.CANCELLED, TaskStatus.EXPIRED, TaskStatus.LAUNCH_UNKNOWN):
        ended[status] = launched(outcome=TaskCreated(task=snapshot("working", task_id=f"r-{status}")))
        Task.objects.filter(pk=ended[status].pk).update(status=status, status_message=f"<{status}>")
    asking = launched(outcome=TaskCreated(task=snapshot("working", task_id="r-asking")))
    question = {"method": "elicitation/create", "params": {"message": "Go?", "requestedSchema": {"type": "object"}}}
    services.apply_snapshot(
        task=asking, snapshot=snapshot("input_required", task_id="r-asking", inputRequests={"go": question})
    )
    secrets = {}
    for name, user in [("agent", agent), ("olga", olga)]:
        _, secrets[name] = create_token(user=user, name=name)
    _, secrets["revoked"] = create_token(user=agent, name="revoked")
    revoke_token(token=ApiToken.objects.get(name="revoked"))
    _, secrets["expired"] = create_token(user=agent, name="expired", expires_at=timezone.now() - datetime.timedelta(1))
    inactive = make_user("gone", OPERATORS)
    _, secrets["inactive"] = create_token(user=inactive, name="gone")
    theirs_before_they_left = launched(user=inactive, outcome=TaskCreated(task=snapshot("working", task_id="r-gone")))
    get_user_model().objects.filter(pk=inactive.pk).update(is_active=False)
    tasks = {
        "working": working,
        "launching": launched(),
        "completed": completed,
        "failed": failing,
        "lost": lost,
        "cancelled": ended[TaskStatus.CANCELLED],
        "expired": ended[TaskStatus.EXPIRED],
        "launch_unknown": ended[TaskStatus.LAUNCH_UNKNOWN],
        "input_required": asking,
        "olgas": launched(user=olga, outcome=TaskCreated(task=snapshot("working", task_id="r-olga"))),
        "gones": theirs_before_they_left,
        "on_beta": launched(server=beta, outcome=TaskCreated(task=snapshot("working", task_id="r-beta"))),
    }
    return {"tasks": {name: str(task.id) for name, task in tasks.items()}, "secrets": secrets}


def stamp_tokens_used() -> None:
    # A token used within the minute is not stamped again (tokens.LAST_USED_RESOLUTION): the plain case.
    ApiToken.objects.update(last_used_at=timezone.now())


def end_direct_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [direct.POOL_NAME],
        )
        return cursor.fetchone()[0]


def request(
    secret: str | None, task_id, *, path="/mcp/servers/alpha", body=None, headers=None, method="POST", repeated=()
):
    """The request as an agent sends it: its body, headers (`headers` overrides; a None value drops one; `repeated`:
    more, after them) and path."""
    if body is None:
        body = {"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"taskId": task_id, "_meta": DECLARING}}
    named = {
        "host": "testserver",
        "content-type": "application/json",
        "mcp-method": "tasks/get",
        "mcp-name": task_id if isinstance(task_id, str) else None,
        "authorization": f"Bearer {secret}" if secret else None,
        **(headers or {}),
    }
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    scope_headers = [(name.encode(), value.encode()) for name, value in [*named.items(), *repeated] if value]
    return method, path, raw, scope_headers


def both_ways() -> tuple[KeptRequestThreads, KeptRequestThreads, list[bool]]:
    """taskhub's HTTP application with Django alone, and as daphne serves it, whose direct answers (True) and
    declines (False) are recorded in the list."""
    answered = []

    async def answer_recorded(scope, body):
        answer = await direct.answer_tasks_get(scope, body)
        answered.append(answer is not None)
        return answer

    as_served = KeptRequestThreads(OneTripHandler(), direct_answers={direct.METHOD: answer_recorded})
    return KeptRequestThreads(OneTripHandler()), as_served, answered


def http_scope(method: str, path: str, headers, *, scheme: str = "http") -> dict:
    return {
        "type": "http",
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "scheme": scheme,
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }


async def send(app, method, path, body, headers, *, chunks: int = 1, scheme: str = "http") -> dict:
    """The response to the request, its body sent in `chunks` ASGI messages, as daphne sends a large one."""
    communicator = ApplicationCommunicator(app, http_scope(method, path, headers, scheme=scheme))
    size = -(-len(body) // chunks) if body else 0
    parts = [body[i * size : (i + 1) * size] for i in range(chunks)] if body else [b""]
    for index, part in enumerate(parts):
        await communicator.send_input({"type": "http.request", "body": part, "more_body": index < len(parts) - 1})
    start = await communicator.receive_output(timeout=10)
    assert start["type"] == "http.response.start", start
    body_out = b""
    while True:
        message = await communicator.receive_output(timeout=10)
        body_out += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(timeout=10)
    return {"status": start["status"], "headers": start["headers"], "body": body_out}


def requests_served(label: str, status: int) -> float:
    return (
        REGISTRY.get_sample_value(
            "taskhub_http_requests_total", {"method": "POST", "view": label, "status": str(status)}
        )
        or 0.0
    )


def comparable(response: dict) -> tuple:
    headers = sorted(
        (name.lower(), value) for name, value in response["headers"] if name.lower() not in VOLATILE_HEADERS
    )
    return response["status"], response["body"], headers


@pytest.mark.django_db(transaction=True)
async def test_a_plain_tasks_get_is_answered_directly_and_exactly_as_djangos_path_answers_every_request():
    world = await sync_to_async(make_world)()
    tasks, secrets = world["tasks"], world["secrets"]
    django_alone, as_served, answered = both_ways()
    agent = secrets["agent"]
    plain = {
        f"{name} task": request(agent, tasks[name])
        for name in ("working", "completed", "failed", "lost", "cancelled", "expired", "launch_unknown")
    } | {
        "on the aggregate endpoint": request(agent, tasks["working"], path="/mcp"),
        "another server's task on the aggregate endpoint": request(agent, tasks["on_beta"], path="/mcp"),
        "a string id": request(
            agent,
            tasks["working"],
            body={
                "jsonrpc": "2.0",
                "id": "a-7",
                "method": "tasks/get",
                "params": {"taskId": tasks["working"], "_meta": DECLARING},
            },
        ),
    }
    through_django = {
        "a task still launching": request(agent, tasks["launching"]),
        "a task asking for input": request(agent, tasks["input_required"]),
        "another user's task": request(agent, tasks["olgas"]),
        "another server's task": request(agent, tasks["on_beta"]),
        "no such task": request(agent, "00000000-0000-0000-0000-000000000000"),
        "not a task id": request(agent, "not-a-uuid"),
        "a number for a task id": request(agent, 7),
        "an inactive user's token, for their own task": request(secrets["inactive"], tasks["gones"]),
        "an expired token, for its user's own task": request(secrets["expired"], tasks["working"]),
        "a revoked token, for its user's own task": request(secrets["revoked"], tasks["working"]),
        "an unknown token": request("thk_unknown", tasks["working"]),
        "no token": request(None, tasks["working"]),
        "another scheme": request(None, tasks["working"], headers={"authorization": f"Basic {agent}"}),
        "a lying Mcp-Name": request(agent, tasks["working"], headers={"mcp-name": tasks["completed"]}),
        "a lying Mcp-Method": request(
            agent, tasks["working"], body={"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"_meta": DECLARING}}
        ),
        "no _meta": request(
            agent,
            tasks["working"],
            body={"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": tasks["working"]}},
        ),
        "no tasks extension": request(
            agent,
            tasks["working"],
            body={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tasks/get",
                "params": {
                    "taskId": tasks["working"],
                    "_meta": {**DECLARING, "io.modelcontextprotocol/clientCapabilities": {}},
                },
            },
        ),
        "a notification": request(
            agent,
            tasks["working"],
            body={"jsonrpc": "2.0", "method": "tasks/get", "params": {"taskId": tasks["working"], "_meta": DECLARING}},
        ),
        "not JSON": request(agent, tasks["working"], body=b"{not json"),
        "a NUL in the body": request(
            agent,
            tasks["working"],
            body=b'{"jsonrpc": "2.0", "id": "\\u0000", "method": "tasks/get", "params": {}}',
        ),
        "a host Django refuses": request(agent, tasks["working"], headers={"host": "evil.example"}),
        "GET": request(agent, tasks["working"], method="GET"),
        "no such server": request(agent, tasks["working"], path="/mcp/servers/nowhere"),
        "a NUL in the server's name": request(agent, tasks["working"], path="/mcp/servers/al\x00pha"),
        "a second Authorization header": request(
            agent, tasks["working"], repeated=[("authorization", f"Bearer {secrets['olga']}")]
        ),
        "a browser's language": request(agent, tasks["working"], headers={"accept-language": "zh-hans"}),
        "a cookie": request(agent, tasks["working"], headers={"cookie": "sessionid=x"}),
        "a body past what is read for a direct answer": request(
            agent,
            tasks["working"],
            body={
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tasks/get",
                "params": {"taskId": tasks["working"], "_meta": {**DECLARING, "padding": "x" * 70_000}},
            },
        ),
    }
    try:
        for name, (method, path, body, headers) in {**plain, **through_django}.items():
            await sync_to_async(stamp_tokens_used)()
            answered.clear()
            expected = await send(django_alone, method, path, body, headers)
            served = await send(as_served, method, path, body, headers)
            assert comparable(served) == comparable(expected), name
            assert answered == ([True] if name in plain else [False] * len(answered)), name
            if name in plain:
                assert expected["status"] == 200 and b'"result"' in served["body"], name
                # The same in three pieces, as daphne hands a body over; and counted in /metrics as Django counts it.
                label = direct.route(path).view_label
                before = requests_served(label, 200)
                answered.clear()
                assert comparable(await send(as_served, method, path, body, headers, chunks=3)) == comparable(expected)
                assert answered == [True] and requests_served(label, 200) == before + 1, name
                await send(django_alone, method, path, body, headers)
                assert requests_served(label, 200) == before + 2, name

        # A token not used for a minute goes to Django, which stamps when it was used.
        await sync_to_async(ApiToken.objects.update)(last_used_at=None)
        answered.clear()
        served = await send(as_served, *request(agent, tasks["working"]))
        assert served["status"] == 200 and answered == [False]
        assert await ApiToken.objects.filter(name="agent", last_used_at__isnull=False).aexists()
        answered.clear()
        expected = await send(as_served, *request(agent, tasks["working"]))
        assert answered == [True]

        # Postgres ends the direct reads' sessions (a restart, a failover): the poll after it is answered all the same.
        assert await sync_to_async(end_direct_sessions)() >= 1
        answered.clear()
        served = await send(as_served, *request(agent, tasks["working"]))
        assert comparable(served) == comparable(expected)
        served = await send(as_served, *request(agent, tasks["working"]))
        assert comparable(served) == comparable(expected) and answered[-1] is True
    finally:
        await direct.close_pools()
        for app in (django_alone, as_served):
            await asyncio.to_thread(app.close_connections)
        await sync_to_async(connections.close_all)()


@pytest.mark.django_db(transaction=True)
async def test_over_https_behind_a_proxy_the_direct_answer_has_djangos_security_headers_and_plain_http_is_redirected(
    settings,
):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    world = await sync_to_async(make_world)()
    await sync_to_async(stamp_tokens_used)()
    django_alone, as_served, answered = both_ways()
    agent, working = world["secrets"]["agent"], world["tasks"]["working"]
    try:
        for proto, scheme, direct_answer, status in [
            ("https", "http", True, 200),  # TLS ended at the proxy
            ("http", "https", False, 301),  # the proxy says plain HTTP: Django redirects
            (None, "https", True, 200),  # no proxy header: the connection's own scheme
            (None, "http", False, 301),
        ]:
            asked = request(agent, working, headers={"x-forwarded-proto": proto})
            answered.clear()
            expected = await send(django_alone, *asked, scheme=scheme)
            served = await send(as_served, *asked, scheme=scheme)
            assert comparable(served) == comparable(expected), (proto, scheme)
            assert served["status"] == status and answered == [direct_answer], (proto, scheme)
            if status == 200:
                assert (b"strict-transport-security", b"max-age=3600; includeSubDomains") in comparable(served)[2]
    finally:
        await direct.close_pools()
        for app in (django_alone, as_served):
            await asyncio.to_thread(app.close_connections)
        await sync_to_async(connections.close_all)()


async def test_a_poll_whose_client_leaves_before_its_body_is_whole_ends_without_an_answer():
    """Django is told the client left (daphne says so only once, and the direct answer's read took it)."""
    app = KeptRequestThreads(OneTripHandler(), direct_answers={direct.METHOD: direct.answer_tasks_get})
    method, path, body, headers = request("thk_x", "00000000-0000-0000-0000-000000000000")
    scope = http_scope(method, path, headers)
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": body[:10], "more_body": True})
    await communicator.send_input({"type": "http.disconnect"})
    await communicator.wait(timeout=5)
    assert await communicator.receive_nothing()
