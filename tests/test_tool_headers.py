"""Custom headers from tool parameters (SEP-2243): the CLI's `call` and the worker's launch mirror `x-mcp-header`
arguments into `Mcp-Param-*` headers, in the spec's encoding, and refuse a tool whose annotations are invalid.

The headers are judged by tests/header_server.py, a real HTTP server that checks them with its own code (not the
SDK's codec the client uses) and answers an error when they differ from the arguments.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.urls import reverse

from taskhub.accounts.groups import OPERATORS
from taskhub.mcp.tool_headers import header_problem, param_headers
from taskhub.servers.catalogue import find_tool
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.errors import LaunchRefused
from taskhub.tasks.models import Task, TaskStatus
from taskhub.worker import jobs
from tests.account_fixtures import make_user
from tests.catalogue_fixtures import with_tools
from tests.demo_process import demo_env
from tests.header_server import BROKEN, DEPLOY, HeaderServer, header_problems

PROJECT_DIR = Path(__file__).resolve().parent.parent

# Plain, integer, boolean, then values that need the base64 form: non-ASCII and edge whitespace, a control
# character in a nested argument; `comment` has no annotation.
ARGUMENTS = {
    "region": "us-west1",
    "priority": 42,
    "dry_run": False,
    "note": " Grüße, 世界 ",
    "target": {"zone": "eu\n1"},
    "comment": "not mirrored",
}


@pytest.fixture(scope="module")
def header_server():
    server = HeaderServer().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def all_tools_listed(request):
    if "header_server" in request.fixturenames:
        request.getfixturevalue("header_server").listed = [DEPLOY, BROKEN]


# --- the encoding and the validity check (the SDK's public code, behind taskhub.mcp.tool_headers) ----------------


def test_the_headers_follow_the_spec_encoding_and_omit_null_and_absent_values():
    headers = param_headers(DEPLOY["inputSchema"], {**ARGUMENTS, "priority": None})
    assert headers == {
        "Mcp-Param-Region": "us-west1",
        "Mcp-Param-DryRun": "false",
        "Mcp-Param-Note": "=?base64?IEdyw7zDn2UsIOS4lueVjCA=?=",
        "Mcp-Param-Zone": "=?base64?ZXUKMQ==?=",
    }
    # The test server's own reading of the spec agrees with it.
    lowered = {name.lower(): value for name, value in headers.items()}
    assert header_problems(DEPLOY["inputSchema"], {**ARGUMENTS, "priority": None}, lowered) == []
    assert header_problems(DEPLOY["inputSchema"], ARGUMENTS, lowered) == ["mcp-param-priority missing"]


@pytest.mark.parametrize(
    ("properties", "named"),
    [
        ({"score": {"type": "number", "x-mcp-header": "Score"}}, "got 'number'"),
        ({"a": {"type": "string", "x-mcp-header": "Id"}, "b": {"type": "string", "x-mcp-header": "ID"}}, "duplicates"),
        ({"a": {"type": "string", "x-mcp-header": "My Region"}}, "'My Region' is not an RFC 9110 token"),
        ({"a": {"type": "string", "x-mcp-header": ""}}, "'' is not an RFC 9110 token"),
        ({"a": {"anyOf": [{"type": "string", "x-mcp-header": "A"}]}}, "not reachable via a pure `properties` chain"),
        ({"a": {"type": "string", "x-mcp-header": 7}}, "must be a string, not int"),
    ],
)
def test_an_invalid_annotation_is_named(properties, named):
    problem = header_problem({"type": "object", "properties": properties})
    assert problem is not None and named in problem and "\n" not in problem


def test_valid_absent_or_absurd_schemas_never_raise():
    assert header_problem(DEPLOY["inputSchema"]) is None
    assert header_problem(None) is None and header_problem("junk") is None
    deep: dict = {"type": "object"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"p": deep}}
    assert header_problem(deep) is None
    assert param_headers(BROKEN["inputSchema"], {"score": 1}) == {}
    long_name = {"type": "object", "properties": {"x" * 5000: {"type": "number", "x-mcp-header": "X"}}}
    assert len(header_problem(long_name)) <= 300


# --- the command line -------------------------------------------------------------------------------------------


def run_cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskhub.mcp", *arguments],
        cwd=PROJECT_DIR,
        env=demo_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_the_cli_mirrors_the_arguments_into_headers_the_server_accepts(header_server):
    arguments = {**ARGUMENTS, "dry_run": None}
    run = run_cli("call", "--url", header_server.url, "deploy", "--args", json.dumps(arguments), "--timeout", "30")
    assert run.returncode == 0, run.stderr
    (call,) = [call for call in header_server.calls_of("deploy") if call["arguments"] == arguments]
    assert call["problems"] == []
    assert call["headers"] == {
        "mcp-param-region": "us-west1",
        "mcp-param-priority": "42",
        "mcp-param-note": "=?base64?IEdyw7zDn2UsIOS4lueVjCA=?=",
        "mcp-param-zone": "=?base64?ZXUKMQ==?=",
    }
    assert "headers checked: mcp-param-note=" in run.stdout


@pytest.mark.slow
def test_the_cli_refuses_a_tool_with_invalid_annotations_before_calling_it(header_server):
    run = run_cli("call", "--url", header_server.url, "broken", "--args", '{"score": 1}', "--timeout", "30")
    assert run.returncode == 4, run.stderr
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert "'broken' cannot be called: its x-mcp-header annotations are invalid" in run.stderr
    assert "property 'score'" in run.stderr and "got 'number'" in run.stderr
    assert header_server.calls_of("broken") == []

    listing = run_cli("discover", "--url", header_server.url)
    assert listing.returncode == 0
    assert "cannot be called: invalid x-mcp-header annotations (property 'score'" in listing.stdout


# --- the dashboard: launch refused, worker's launch path -----------------------------------------------------------


@pytest.mark.django_db
def test_a_launch_of_a_tool_with_invalid_annotations_is_refused_and_changes_nothing(client):
    server = create_server(name="headers", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    server = with_tools(server, BROKEN)
    assert "invalid x-mcp-header" in find_tool(server, "broken").labels[0].text
    with pytest.raises(LaunchRefused, match=r"'broken' cannot be launched: .* invalid x-mcp-header .*'score'"):
        services.launch(server=server, tool="broken", arguments={"score": 1}, user=None)

    client.force_login(make_user("olga", OPERATORS))
    page = client.get(reverse("tasks:launch_tool", args=[server.pk, "broken"])).content.decode()
    assert 'role="alert">This tool cannot be launched: the server describes it with invalid x-mcp-header' in page
    response = client.post(
        reverse("tasks:launch_tool", args=[server.pk, "broken"]), {"mode": "json", "arguments_json": '{"score": 1}'}
    )
    assert "the server headers describes it with invalid x-mcp-header" in response.content.decode()  # the refusal
    assert not Task.objects.exists()


def launched(header_server: HeaderServer, tool: str, arguments: dict, *, catalogue: dict) -> Task:
    server = create_server(name="headers", transport="http", url=header_server.url, user=None)
    return services.launch(server=with_tools(server, catalogue), tool=tool, arguments=arguments, user=None)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("listing", ["listed live", "only in the stored catalogue"])
def test_the_worker_launch_sends_the_headers_the_server_checks(header_server, listing):
    if listing == "only in the stored catalogue":
        header_server.listed = []  # the server lists nothing now: the catalogue alone tells which headers to send
    task = launched(header_server, "deploy", ARGUMENTS, catalogue=DEPLOY)
    assert async_to_sync(jobs.launch)(task.id) == "ToolCompleted"
    task = Task.objects.get(pk=task.pk)
    assert task.status == TaskStatus.COMPLETED, task.error
    call = header_server.calls_of("deploy")[-1]
    assert call["arguments"] == ARGUMENTS
    assert call["problems"] == [] and set(call["headers"]) == {
        "mcp-param-region",
        "mcp-param-priority",
        "mcp-param-dryrun",
        "mcp-param-note",
        "mcp-param-zone",
    }
    assert "mcp-param-zone==?base64?ZXUKMQ==?=" in task.result["content"][0]["text"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_worker_refuses_a_tool_the_server_now_describes_with_invalid_annotations(header_server):
    # Discovered back when it was fine: the launch is accepted, the live listing then says otherwise.
    task = launched(header_server, "broken", {"score": 1}, catalogue={"name": "broken", "inputSchema": {}})
    assert async_to_sync(jobs.launch)(task.id) == "not sent"
    task = Task.objects.get(pk=task.pk)
    assert task.status == TaskStatus.FAILED
    assert task.error["kind"] == "InvalidToolDefinition"
    assert task.error["message"].startswith("The tool call was not sent: the tool 'broken' cannot be called")
    assert header_server.calls_of("broken") == []
