"""Text Postgres cannot store (NUL, lone surrogates) in launch arguments and answers is refused with a field
error on the pages and a 400 JSON error in the API, never a DataError 500; API errors are JSON in every case,
503 while the database cannot be reached."""

import json
import re

import pytest
from django.contrib.auth.models import Group
from django.db import connections
from django.db.backends.postgresql.base import DatabaseWrapper
from django.test import Client
from django.urls import reverse

from taskhub.api.tokens import create_token
from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import TaskCreated
from taskhub.mcp.wire import TaskSnapshot
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import AnswerRejected, ArgumentsRejected
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from tests.helpers import free_port

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "properties": {"note": {"type": "string"}}}
QUESTION = {"method": "elicitation/create", "params": {"message": "Why?", "requestedSchema": SCHEMA}}
UNSTORABLE = ["a\x00b", "a\ud800b", "\udfff"]


def user_in(django_user_model, name, *groups):
    user = django_user_model.objects.create_user(name)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


@pytest.fixture
def operator(django_user_model):
    return user_in(django_user_model, "olga", "operators", "approvers")


@pytest.fixture
def server():
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:1/mcp", user=None)
    Server.objects.filter(pk=server.pk).update(tools=[{"name": "note", "inputSchema": SCHEMA}])
    server.refresh_from_db()
    return server


@pytest.fixture
def question(server, operator):
    task = services.launch(server=server, tool="note", arguments={}, user=operator)
    base = {"taskId": f"remote-{task.pk}", "createdAt": "2026-07-28T10:00:00Z", "ttlMs": 600000}
    task = services.record_launch_outcome(
        task=task, outcome=TaskCreated(task=TaskSnapshot.model_validate({**base, "status": "working"}))
    )
    services.apply_snapshot(
        task=task,
        snapshot=TaskSnapshot.model_validate({**base, "status": "input_required", "inputRequests": {"q": QUESTION}}),
    )
    return InputRequest.objects.get(task=task)


def api_client(user) -> Client:
    _, secret = create_token(user=user, name="tests")
    return Client(headers={"Authorization": f"Bearer {secret}"})


def nothing_stored_since(tasks: int, events: int) -> bool:
    return Task.objects.count() == tasks and AuditEvent.objects.count() == events


# --- services -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", UNSTORABLE)
@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        (lambda t: {"note": t}, "note"),
        (lambda t: {"note": {"deep": [1, {"er": t}]}}, "note"),
        (lambda t: {t: "x"}, ""),
    ],
)
def test_launch_refuses_unstorable_text_anywhere_in_the_arguments(server, operator, text, arguments, field):
    tasks, events = Task.objects.count(), AuditEvent.objects.count()
    with pytest.raises(ArgumentsRejected) as refused:
        services.launch(server=server, tool="note", arguments=arguments(text), user=operator)
    assert list(refused.value.field_errors) == [field]
    assert "cannot be stored" in refused.value.field_errors[field]
    assert nothing_stored_since(tasks, events)


@pytest.mark.parametrize("text", UNSTORABLE)
def test_an_answer_with_unstorable_text_is_refused_and_the_request_stays_open(question, operator, text):
    with pytest.raises(AnswerRejected) as refused:
        services.answer_input(
            input_request=question, response={"action": "accept", "content": {"note": text}}, user=operator
        )
    assert list(refused.value.field_errors) == ["note"]
    question.refresh_from_db()
    assert question.state == InputRequestState.OPEN


# --- pages ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", UNSTORABLE[:2])
def test_the_launch_pages_json_box_shows_a_field_error(server, operator, text):
    client = Client()
    client.force_login(operator)
    tasks, events = Task.objects.count(), AuditEvent.objects.count()
    url = reverse("tasks:launch_tool", args=[server.pk, "note"])
    response = client.post(url, {"mode": "json", "arguments_json": json.dumps({"note": text})})
    assert response.status_code == 400
    assert "note: This value contains" in response.content.decode()
    assert nothing_stored_since(tasks, events)


def test_the_launch_pages_form_shows_the_error_next_to_the_field(server, operator):
    client = Client()
    client.force_login(operator)
    url = reverse("tasks:launch_tool", args=[server.pk, "note"])
    field_name = re.search(r'name="([^"]*note)"', client.get(url).content.decode()).group(1)
    response = client.post(url, {"mode": "form", field_name: "a\x00b"})
    assert response.status_code == 400
    assert "contains a NUL character" in response.content.decode()
    assert not Task.objects.filter(tool="note", arguments__note__isnull=False).exists()


def test_the_inbox_answer_shows_a_field_error(question, operator):
    client = Client()
    client.force_login(operator)
    field_name = re.search(r'name="([^"]*note)"', client.get(reverse("tasks:inbox")).content.decode()).group(1)
    response = client.post(reverse("tasks:answer", args=[question.pk]), {"action": "accept", field_name: "a\x00b"})
    assert response.status_code == 400
    assert "contains a NUL character" in response.content.decode()
    question.refresh_from_db()
    assert question.state == InputRequestState.OPEN


# --- API ------------------------------------------------------------------------------------------------


def post_raw_json(client: Client, url: str, text: str):
    return client.post(url, data=text.encode(), content_type="application/json")


@pytest.mark.parametrize("text", UNSTORABLE[:2])
def test_the_api_answers_400_json_for_unstorable_arguments_and_answers(server, question, operator, text):
    client = api_client(operator)
    tasks, events = Task.objects.count(), AuditEvent.objects.count()
    launched = post_raw_json(
        client, "/api/tasks", json.dumps({"server": "demo", "tool": "note", "arguments": {"note": text}})
    )
    assert launched.status_code == 400
    assert "note" in launched.json()["fields"]
    assert nothing_stored_since(tasks, events)

    answer_url = f"/api/input-requests/{question.pk}/answer"
    answered = post_raw_json(client, answer_url, json.dumps({"action": "accept", "content": {"note": text}}))
    assert answered.status_code == 400
    assert "note" in answered.json()["fields"]
    question.refresh_from_db()
    assert question.state == InputRequestState.OPEN


def test_the_api_answers_json_for_nul_in_any_string_it_looks_up(operator):
    response = post_raw_json(api_client(operator), "/api/tasks", '{"server": "de\\u0000mo", "tool": "note"}')
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert "error" in json.loads(response.content)


def test_an_unknown_api_path_is_a_json_404(operator):
    response = api_client(operator).get("/api/no-such-thing")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]


def test_api_errors_are_json_503_while_the_database_is_down(operator):
    client = api_client(operator)
    signed_in = Client(raise_request_exception=False)  # as a server does: the exception becomes the error page
    signed_in.force_login(operator)
    original = connections["default"]
    unreachable = {**original.settings_dict, "HOST": "127.0.0.1", "PORT": free_port(), "CONN_MAX_AGE": 0}
    unreachable["OPTIONS"] = {**unreachable.get("OPTIONS", {}), "connect_timeout": 2}
    connections["default"] = DatabaseWrapper(unreachable, "default")
    try:
        responses = [
            client.get("/api/tasks"),
            client.post("/api/tasks", {}, content_type="application/json"),
            signed_in.get("/api/docs"),  # not a ninja endpoint: its session is read outside ninja's handlers
        ]
    finally:
        connections["default"].close()
        connections["default"] = original
    for response in responses:
        assert response.status_code == 503
        assert response["Content-Type"].startswith("application/json")
        assert "database" in response.json()["error"]
