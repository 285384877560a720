"""Issue 31 point 5, by generated input: whatever a client sends the API (every operation of its OpenAPI schema,
schemathesis) or the gateway (JSON-RPC messages and any JSON, hypothesis), the answer is JSON and never a 500.

Derandomized (the same examples on every run), a bounded number per operation: a regression shows on every run, not
once in a while. tests/test_machine_input.py names the cases the attack found; this looks for the ones nobody named.
"""

import json
from urllib.parse import quote

import pytest
import schemathesis
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core import NOT_SET

from taskhub.accounts.groups import ADMINS
from taskhub.api.endpoints import api
from taskhub.api.tokens import create_token
from taskhub.approvals import services as policy_services
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from tests.account_fixtures import make_user

pytestmark = pytest.mark.django_db

DEPLOY = {"name": "deploy", "inputSchema": {"type": "object", "properties": {"target": {"type": "string"}}}}
EXAMPLES_PER_OPERATION = 25
GATEWAY_EXAMPLES = 300
FUZZ = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def token(settings):
    settings.TASKHUB_GATEWAY_SYNC_WAIT_SECONDS = 0  # a generated tools/call that launches waits for nobody
    settings.TASKHUB_GATEWAY_LAUNCH_WAIT_SECONDS = 0
    alpha = create_server(name="alpha", transport="http", url="http://127.0.0.1:9/alpha", user=None)
    Server.objects.filter(pk=alpha.pk).update(tools=[DEPLOY], discovered_at=timezone.now())
    policy_services.create_policy(server=alpha, tool="deploy", user=None)
    _, secret = create_token(user=make_user("ada", ADMINS), name="fuzz")
    return secret


def assert_json_and_no_server_error(status: int, content_type: str, body: bytes, what: str) -> None:
    assert status < 500, f"{what}: {status} {body[:300]!r}"
    if status != 204 and body:
        assert content_type.startswith("application/json"), f"{what}: {status} {content_type} {body[:300]!r}"
        json.loads(body)


def test_every_api_operation_answers_generated_input_with_json_never_a_500(token):
    client = Client(headers={"Authorization": f"Bearer {token}"})
    schema = schemathesis.openapi.from_dict(api.get_openapi_schema())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 14, [operation.label for operation in operations]
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):  # input that fits the schema, and not
            fuzz(operation, mode, client)


def fuzz(operation, mode: GenerationMode, client: Client) -> None:
    @FUZZ
    @given(case=operation.as_strategy(generation_mode=mode), poison=st.sampled_from(POISONS), data=st.data())
    def answers(case, poison: str | None, data) -> None:
        if poison is not None:  # text no database or codec takes, in one of the strings generated
            case.body = poisoned(case.body, poison, data)
            case.query = poisoned(case.query, poison, data)
        # Sent by Django's test client: a lone surrogate travels as JSON's \\ud800 or a URL's %ED%A0%80, as a
        # client that means harm sends it (schemathesis's own transport cannot encode one).
        body = body_of(case)
        response = client.generic(case.method, url_of(case), body, content_type="application/json")
        content_type = response.headers.get("Content-Type", "")
        what = f"{operation.label} body={case.body!r} query={case.query!r}"
        assert_json_and_no_server_error(response.status_code, content_type, response.content, what)

    answers()


POISONS = [None, "\x00", "\ud800"]


def body_of(case) -> bytes:
    if case.body is NOT_SET:
        return b""
    if isinstance(case.body, bytes):  # negative generation: not JSON at all
        return case.body
    if isinstance(case.body, str) and case.media_type != "application/json":
        return case.body.encode("utf-8", "surrogatepass")
    return json.dumps(case.body).encode()


def url_of(case) -> str:
    def encoded(text) -> str:
        return quote(str(text).encode("utf-8", "surrogatepass"), safe="")

    query = case.query if isinstance(case.query, dict) else {}
    pairs = [(name, item) for name, value in query.items() for item in (value if isinstance(value, list) else [value])]
    return case.formatted_path + ("?" + "&".join(f"{encoded(k)}={encoded(v)}" for k, v in pairs) if pairs else "")


def poisoned(value, poison: str, data):
    """`value` with `poison` put into one of its strings (a value or a key), drawn; as it was when it has none."""
    places = list(string_places(value, ()))
    if not places:
        return value
    path, is_key = data.draw(st.sampled_from(places))
    return put(value, path, is_key, poison)


def string_places(value, path):
    if isinstance(value, str):
        yield path, False
    elif isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key), True
            yield from string_places(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from string_places(item, (*path, index))


def put(value, path, is_key: bool, poison: str):
    if not path:
        return value + poison
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [put(item, rest, is_key, poison) if index == head else item for index, item in enumerate(value)]
    if is_key and not rest:
        return {(key + poison if key == head else key): item for key, item in value.items()}
    return {key: (put(item, rest, is_key, poison) if key == head else item) for key, item in value.items()}


# Any code point (lone surrogates too), and the ones that broke the API before, often.
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=20) | st.sampled_from(
    ["\x00", "\ud800", "a\x00"]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)
# Every method the gateway knows but subscriptions/listen (an open stream: tests/test_gateway.py), and others.
METHODS = (
    st.sampled_from(
        [
            "initialize",
            "server/discover",
            "tools/list",
            "tools/call",
            "tasks/get",
            "tasks/update",
            "tasks/cancel",
            "ping",
        ]
    )
    | TEXT
)
PARAMS = JSON | st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["deploy", "alpha__deploy"]) | TEXT,
        "arguments": JSON,
        "taskId": TEXT,
        "inputResponses": JSON,
        "_meta": JSON,
    },
)
MESSAGES = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0") | st.text(max_size=4), "method": METHODS},
    optional={"id": st.integers() | TEXT | st.none() | st.floats(allow_nan=False), "params": PARAMS},
)


def test_the_gateway_answers_generated_json_rpc_with_json_never_a_500(token):
    client = Client(headers={"Authorization": f"Bearer {token}"})

    @settings(FUZZ, max_examples=GATEWAY_EXAMPLES)
    @given(
        path=st.sampled_from(["/mcp", "/mcp/servers/alpha"]),
        body=MESSAGES | JSON | st.lists(MESSAGES, max_size=3),
        poison=st.sampled_from(POISONS),
        data=st.data(),
    )
    def answers(path: str, body, poison: str | None, data) -> None:
        if isinstance(body, dict) and body.get("method") == "subscriptions/listen":
            return
        if poison is not None:
            body = poisoned(body, poison, data)
        response = client.post(path, json.dumps(body), content_type="application/json")
        content_type = response.headers.get("Content-Type", "")
        assert_json_and_no_server_error(response.status_code, content_type, response.content, f"{path} {body!r}")

    answers()
