"""The demo MCP server (taskhub/demo) on the wire: raw JSON-RPC over real HTTP and stdio.

Every result is validated against the Tasks extension's JSON Schema (tests/spec/schema.json).
"""

from __future__ import annotations

import asyncio
import base64
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from taskhub.demo.server import tcp_socket
from tests.demo_fixtures import (
    SUBSCRIPTION_ID,
    TASKS,
    HttpClient,
    StdioClient,
    assert_valid,
    meta,
)
from tests.demo_process import DemoServer
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

ISO_8601 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
NO_EXTENSION = {"elicitation": {"form": {}, "url": {}}}
TASK_ENVELOPE = {"taskId", "status", "result", "error", "inputRequests"}
VARIANT = {
    "working": "WorkingTask",
    "input_required": "InputRequiredTask",
    "completed": "CompletedTask",
    "failed": "FailedTask",
    "cancelled": "CancelledTask",
}


@pytest.fixture(scope="module")
def server():
    demo = DemoServer("--poll-interval-ms", "250").start()
    yield demo
    demo.stop()


@pytest.fixture
def client(server) -> HttpClient:
    http = HttpClient(server.url)
    yield http
    http.close()


def text_of(result: dict[str, Any]) -> str:
    return result["content"][0]["text"]


def assert_detailed_task(task: dict[str, Any]) -> None:
    """A tasks/get result: valid GetTaskResult, and valid as the variant its status names."""
    assert task["resultType"] == "complete"
    assert_valid("GetTaskResult", task)
    assert_valid(VARIANT[task["status"]], task)
    assert ISO_8601.match(task["createdAt"]) and ISO_8601.match(task["lastUpdatedAt"])
    assert task["lastUpdatedAt"] >= task["createdAt"]
    assert "requestState" not in task and "ttl" not in task and "pollInterval" not in task


def assert_create_task_result(created: dict[str, Any]) -> None:
    assert_valid("CreateTaskResult", created)
    assert created["resultType"] == "task"
    assert not {"result", "error", "inputRequests", "requestState", "task", "ttl", "pollInterval"} & set(created)
    assert ISO_8601.match(created["createdAt"]) and ISO_8601.match(created["lastUpdatedAt"])
    assert created["ttlMs"] is None or (isinstance(created["ttlMs"], int) and created["ttlMs"] > 0)
    assert isinstance(created["pollIntervalMs"], int) and created["pollIntervalMs"] > 0
    assert len(created["taskId"]) >= 20  # unguessable: 18 random bytes


def assert_empty_ack(ack: dict[str, Any]) -> None:
    assert ack["resultType"] == "complete"
    assert not TASK_ENVELOPE & set(ack)


# --- discovery and tools/call ---------------------------------------------------------------------------------


def test_discover_advertises_the_extension_under_extensions(client):
    discovered = client.call("server/discover")
    assert discovered["capabilities"]["extensions"][TASKS] == {}
    assert "tasks" not in discovered["capabilities"]


def test_tools_list_offers_the_contract_tools_only_without_conformance_flag(client):
    names = {tool["name"] for tool in client.call("tools/list")["tools"]}
    expected = {"quick", "progress", "approval", "two_questions", "url_consent", "fail", "tool_error", "long", "mrtr"}
    assert names == expected


def test_sync_tool_returns_a_complete_call_tool_result(client):
    result = client.call_tool("quick", {"text": "hi"})
    assert_valid("Result", result)
    assert result["resultType"] == "complete" and text_of(result) == "echo: hi" and result["isError"] is False
    assert "taskId" not in result


def test_task_tool_returns_a_flat_create_task_result_that_resolves_at_once(client):
    created = client.call_tool("progress", {"steps": 2, "step_ms": 50})
    assert_create_task_result(created)
    assert created["status"] == "working" and created["statusMessage"] == "step 1 of 2"
    assert created["pollIntervalMs"] == 250
    assert_detailed_task(client.get(created["taskId"]))


def test_each_task_gets_its_own_id(client):
    ids = {client.call_tool("progress", {"steps": 1, "step_ms": 10})["taskId"] for _ in range(5)}
    assert len(ids) == 5


# --- tasks/get in each of the five statuses ----------------------------------------------------------------------


def test_tasks_get_working(client):
    task_id = client.call_tool("long", {"seconds": 30})["taskId"]
    task = client.get(task_id)
    assert_detailed_task(task)
    assert task["status"] == "working" and task["statusMessage"].endswith("of 30 s")
    client.call("tasks/cancel", {"taskId": task_id})


def test_tasks_get_input_required_lists_the_approval_form(client):
    task_id = client.call_tool("approval", {"action": "deploy"})["taskId"]
    task = client.wait_for_status(task_id, "input_required")
    assert_detailed_task(task)
    assert list(task["inputRequests"]) == ["approve"]
    request = task["inputRequests"]["approve"]
    assert_valid("InputRequest", request)
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "form"
    schema = request["params"]["requestedSchema"]
    assert schema["required"] == ["approved"]
    assert schema["properties"]["approved"] == {"type": "boolean", "title": "Approve?"}
    assert schema["properties"]["reason"]["title"] == "Reason"
    client.call("tasks/cancel", {"taskId": task_id})


def test_tasks_get_completed_inlines_the_tool_result(client):
    task_id = client.call_tool("progress", {"steps": 3, "step_ms": 50})["taskId"]
    task = client.wait_for_status(task_id, "completed")
    assert_detailed_task(task)
    assert text_of(task["result"]) == "finished 3 steps" and task["result"]["isError"] is False
    assert "io.modelcontextprotocol/related-task" not in task["result"].get("_meta", {})


def test_tool_error_completes_with_is_error(client):
    task_id = client.call_tool("tool_error")["taskId"]
    task = client.wait_for_status(task_id, "completed", "failed")
    assert_detailed_task(task)
    assert task["status"] == "completed" and task["result"]["isError"] is True
    assert text_of(task["result"]) == "Simulated tool error"


def test_tasks_get_failed_carries_the_error_and_a_status_message(client):
    task_id = client.call_tool("fail")["taskId"]
    task = client.wait_for_status(task_id, "failed", "completed")
    assert_detailed_task(task)
    assert task["error"] == {"code": -32603, "message": "Simulated failure"}
    assert task["statusMessage"] and "result" not in task


def test_tasks_get_cancelled_after_tasks_cancel(client):
    task_id = client.call_tool("long", {"seconds": 30})["taskId"]
    ack = client.call("tasks/cancel", {"taskId": task_id})
    assert_valid("CancelTaskResult", ack)
    assert_empty_ack(ack)
    task = client.wait_for_status(task_id, "cancelled", "completed", "failed")
    assert_detailed_task(task)
    assert task["status"] == "cancelled"


def test_cancel_of_a_terminal_task_is_the_same_empty_ack_and_changes_nothing(client):
    task_id = client.call_tool("progress", {"steps": 1, "step_ms": 10})["taskId"]
    done = client.wait_for_status(task_id, "completed")
    assert_empty_ack(client.call("tasks/cancel", {"taskId": task_id}))
    assert client.get(task_id) == done


# --- input: tasks/update --------------------------------------------------------------------------------------


def test_approval_accept_goes_working_then_completed(client):
    task_id = client.call_tool("approval", {"action": "deploy"})["taskId"]
    client.wait_for_status(task_id, "input_required")
    answer = {"approve": {"action": "accept", "content": {"approved": True, "reason": "looks good"}}}
    ack = client.call("tasks/update", {"taskId": task_id, "inputResponses": answer})
    assert_valid("UpdateTaskResult", ack)
    assert_empty_ack(ack)
    after_answer = client.get(task_id)
    assert after_answer["status"] in ("working", "completed") and "inputRequests" not in after_answer
    task = client.wait_for_status(task_id, "completed")
    assert text_of(task["result"]) == "approved: deploy (reason: looks good)"


@pytest.mark.parametrize(
    ("response", "text"),
    [
        ({"action": "accept", "content": {"approved": False, "reason": "no"}}, "rejected: ship (reason: no)"),
        ({"action": "decline"}, "declined"),
        ({"action": "cancel"}, "declined"),
    ],
)
def test_approval_rejected_declined_or_cancelled(client, response, text):
    task_id = client.call_tool("approval", {"action": "ship"})["taskId"]
    client.wait_for_status(task_id, "input_required")
    client.call("tasks/update", {"taskId": task_id, "inputResponses": {"approve": response}})
    assert text_of(client.wait_for_status(task_id, "completed")["result"]) == text


def test_partial_answers_leave_only_the_unanswered_key_and_stray_keys_are_ignored(client):
    task_id = client.call_tool("two_questions")["taskId"]
    asked = client.wait_for_status(task_id, "input_required")
    assert set(asked["inputRequests"]) == {"name", "color"}
    assert_valid("InputRequests", asked["inputRequests"])
    color = asked["inputRequests"]["color"]["params"]["requestedSchema"]["properties"]["color"]
    assert [option["const"] for option in color["oneOf"]] == ["red", "green", "blue"]

    name = {"action": "accept", "content": {"name": "Luca"}}
    client.call("tasks/update", {"taskId": task_id, "inputResponses": {"name": name, "never-issued": {"x": 1}}})
    after_first = client.get(task_id)
    assert_detailed_task(after_first)
    assert after_first["status"] == "input_required" and list(after_first["inputRequests"]) == ["color"]

    again = {"action": "accept", "content": {"name": "Somebody else"}}
    assert_empty_ack(client.call("tasks/update", {"taskId": task_id, "inputResponses": {"name": again}}))
    assert list(client.get(task_id)["inputRequests"]) == ["color"]

    color_answer = {"action": "accept", "content": {"color": "blue"}}
    client.call("tasks/update", {"taskId": task_id, "inputResponses": {"color": color_answer}})
    assert text_of(client.wait_for_status(task_id, "completed")["result"]) == "name=Luca color=blue"


def test_two_concurrent_answers_to_one_key_exactly_one_wins(server, client):
    task_id = client.call_tool("approval", {"action": "race"})["taskId"]
    client.wait_for_status(task_id, "input_required")

    def answer(reason: str) -> dict[str, Any]:
        response = {"action": "accept", "content": {"approved": True, "reason": reason}}
        return HttpClient(server.url).call("tasks/update", {"taskId": task_id, "inputResponses": {"approve": response}})

    with ThreadPoolExecutor(2) as pool:
        acks = list(pool.map(answer, ["first", "second"]))
    assert all(ack["resultType"] == "complete" for ack in acks)
    text = text_of(client.wait_for_status(task_id, "completed")["result"])
    assert text in ("approved: race (reason: first)", "approved: race (reason: second)")
    assert client.stats()["deliveries"][f"{task_id}/approve"] == 2


def test_malformed_answer_to_an_outstanding_key_is_rejected_and_nothing_is_stored(client):
    task_id = client.call_tool("approval")["taskId"]
    client.wait_for_status(task_id, "input_required")
    bad = {"approve": {"action": "accept", "content": {"approved": "yes please"}}}
    reply = client.request("tasks/update", {"taskId": task_id, "inputResponses": bad})
    assert reply.error["code"] == -32602
    assert list(client.get(task_id)["inputRequests"]) == ["approve"]
    client.call("tasks/cancel", {"taskId": task_id})


def test_url_consent_asks_in_url_mode_with_the_task_in_the_url(client):
    task_id = client.call_tool("url_consent")["taskId"]
    task = client.wait_for_status(task_id, "input_required")
    assert_detailed_task(task)
    request = task["inputRequests"]["consent"]
    assert_valid("ElicitRequest", request)
    assert request["params"]["mode"] == "url"
    assert request["params"]["url"] == f"https://example.com/authorize?task={task_id}"
    client.call("tasks/update", {"taskId": task_id, "inputResponses": {"consent": {"action": "accept"}}})
    assert text_of(client.wait_for_status(task_id, "completed")["result"]) == "consented"


def test_mrtr_asks_before_the_task_then_creates_it_from_the_answer(client):
    first = client.call_tool("mrtr")
    assert_valid("Result", first)
    assert first["resultType"] == "input_required" and "taskId" not in first
    assert_valid("InputRequests", first["inputRequests"])
    assert list(first["inputRequests"]) == ["name"]
    assert isinstance(first["requestState"], str)

    retry = {
        "name": "mrtr",
        "arguments": {},
        "inputResponses": {"name": {"action": "accept", "content": {"name": "Ann"}}},
        "requestState": first["requestState"],
    }
    created = client.call("tools/call", retry)
    assert_create_task_result(created)
    assert text_of(client.wait_for_status(created["taskId"], "completed")["result"]) == "hello, Ann"


def test_mrtr_rejects_a_forged_request_state(client):
    forged = {
        "name": "mrtr",
        "arguments": {},
        "inputResponses": {"name": {"action": "accept", "content": {"name": "Eve"}}},
        "requestState": "mrtr",
    }
    assert client.request("tools/call", forged).error["code"] == -32602


# --- errors -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_unknown_task_id_is_invalid_params(client, method):
    params = {"taskId": "no-such-task", **({"inputResponses": {}} if method == "tasks/update" else {})}
    reply = client.request(method, params)
    assert reply.status == 400 and reply.error["code"] == -32602


@pytest.mark.parametrize("method", ["tasks/result", "tasks/list"])
def test_removed_methods_are_method_not_found(client, method):
    assert client.request(method, {"taskId": "x"}).error["code"] == -32601


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_tasks_methods_without_the_extension_are_missing_capability(client, method):
    task_id = client.call_tool("progress", {"steps": 1, "step_ms": 10})["taskId"]
    params = {"taskId": task_id, **({"inputResponses": {}} if method == "tasks/update" else {})}
    reply = client.request(method, params, capabilities=NO_EXTENSION)
    assert reply.status == 400 and reply.error["code"] == -32021
    assert reply.error["data"]["requiredCapabilities"]["extensions"][TASKS] == {}


@pytest.mark.parametrize("tool", ["approval", "two_questions", "url_consent", "long", "mrtr"])
def test_task_only_tools_without_the_extension_are_missing_capability(client, tool):
    reply = client.request("tools/call", {"name": tool, "arguments": {}}, capabilities=NO_EXTENSION)
    assert reply.error["code"] == -32021
    assert reply.error["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}


def test_tools_that_can_run_synchronously_do_so_without_the_extension(client):
    progress = client.call_tool("progress", {"steps": 2, "step_ms": 20}, capabilities=NO_EXTENSION)
    assert progress["resultType"] == "complete" and text_of(progress) == "finished 2 steps"
    tool_error = client.call_tool("tool_error", capabilities=NO_EXTENSION)
    assert tool_error["isError"] is True and text_of(tool_error) == "Simulated tool error"
    failure = client.request("tools/call", {"name": "fail", "arguments": {}}, capabilities=NO_EXTENSION)
    assert failure.error == {"code": -32603, "message": "Simulated failure"}


def test_tools_that_ask_need_the_elicitation_capability(client):
    reply = client.request(
        "tools/call", {"name": "approval", "arguments": {}}, capabilities={"extensions": {TASKS: {}}}
    )
    assert reply.error["code"] == -32021 and reply.error["data"]["requiredCapabilities"] == {
        "elicitation": {"form": {}}
    }
    form_only = {"elicitation": {}, "extensions": {TASKS: {}}}
    reply = client.request("tools/call", {"name": "url_consent", "arguments": {}}, capabilities=form_only)
    assert reply.error["code"] == -32021 and reply.error["data"]["requiredCapabilities"] == {"elicitation": {"url": {}}}


@pytest.mark.parametrize("mcp_name", ["someone-else", None])
def test_mcp_name_header_must_match_the_task_id(client, mcp_name):
    task_id = client.call_tool("progress", {"steps": 1, "step_ms": 10})["taskId"]
    reply = client.request("tasks/get", {"taskId": task_id}, headers={"Mcp-Name": mcp_name})
    assert reply.status == 400 and reply.error["code"] == -32020


def test_base64_encoded_mcp_name_is_accepted(client):
    task_id = client.call_tool("progress", {"steps": 1, "step_ms": 10})["taskId"]
    encoded = "=?base64?" + base64.b64encode(task_id.encode()).decode() + "?="
    assert client.call("tasks/get", {"taskId": task_id}, headers={"Mcp-Name": encoded})["taskId"] == task_id


def test_mcp_method_header_must_match_the_method(client):
    reply = client.request("tools/call", {"name": "quick", "arguments": {"text": "x"}}, headers={"Mcp-Method": "x"})
    assert reply.status == 400 and reply.error["code"] == -32020


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tasks/get", {"taskId": 42}),
        ("tasks/get", {"taskId": "x" * 5000}),
        ("tasks/get", {}),
        ("tasks/update", {"taskId": "x", "inputResponses": "yes"}),
        ("tasks/update", {"taskId": "x", "inputResponses": {f"k{i}": {} for i in range(500)}}),
        ("tasks/update", {"taskId": "x"}),
        ("tasks/cancel", {"taskId": None}),
        ("subscriptions/listen", {"notifications": {"taskIds": "all"}}),
        ("subscriptions/listen", {"notifications": {"taskIds": [1, 2]}}),
        ("tools/call", {"name": "progress", "arguments": {"steps": "many"}}),
    ],
)
def test_malformed_params_are_invalid_params_and_the_server_lives_on(client, method, params):
    # No Mcp-Name either: the body's taskId is what is malformed, so header checks must not decide the outcome.
    reply = client.request(method, params, headers=None if method == "tools/call" else {"Mcp-Name": None})
    if method == "tools/call":
        assert reply.result["isError"] is True
    else:
        assert reply.error["code"] == -32602
    assert client.call_tool("quick", {"text": "still here"})["content"][0]["text"] == "echo: still here"


def test_invalid_arguments_are_a_tool_error_not_a_task(client):
    result = client.call_tool("progress", {"steps": 0})
    assert result["isError"] is True and "steps" in text_of(result) and "taskId" not in result


# --- notifications --------------------------------------------------------------------------------------------


def test_listen_acks_first_then_pushes_every_change_until_the_task_ends(client):
    task_id = client.call_tool("progress", {"steps": 3, "step_ms": 300})["taskId"]
    reply = client.listen([task_id, "not-a-task"])
    listen_id = reply.body["id"]
    ack, *notifications = reply.events
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"] == {"notifications": {"taskIds": [task_id]}, "_meta": {SUBSCRIPTION_ID: listen_id}}
    for notification in notifications:
        assert_valid("TaskStatusNotification", notification)
        assert notification["params"]["_meta"] == {SUBSCRIPTION_ID: listen_id}
        assert notification["params"]["taskId"] == task_id
    # The first notification is the state at subscription time (step 1 unless the machine is slow), then each step.
    messages = [n["params"].get("statusMessage") for n in notifications if n["params"]["status"] == "working"]
    all_steps = ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert messages and messages == all_steps[len(all_steps) - len(messages) :]
    assert notifications[-1]["params"]["status"] == "completed"
    assert text_of(notifications[-1]["params"]["result"]) == "finished 3 steps"
    assert reply.result == {"resultType": "complete", "_meta": {SUBSCRIPTION_ID: listen_id}}


def test_listen_reports_input_requests_and_their_answers(server, client):
    task_id = client.call_tool("two_questions")["taskId"]
    listening: dict[str, Any] = {}
    listener = threading.Thread(target=lambda: listening.update(reply=HttpClient(server.url).listen([task_id])))
    listener.start()
    client.wait_for_status(task_id, "input_required")
    for key, content in [("name", {"name": "Kim"}), ("color", {"color": "red"})]:
        time.sleep(0.2)
        client.call(
            "tasks/update", {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": content}}}
        )
    listener.join(10)
    notifications = listening["reply"].events[1:]
    for notification in notifications:
        assert_valid("TaskStatusNotification", notification)
    asked = [
        sorted(n["params"].get("inputRequests", {})) for n in notifications if n["params"]["status"] == "input_required"
    ]
    assert asked[-2:] == [["color", "name"], ["color"]]
    assert notifications[-1]["params"]["status"] == "completed"


def test_listen_for_tasks_needs_the_extension(client):
    task_id = client.call_tool("progress", {"steps": 1, "step_ms": 10})["taskId"]
    reply = client.listen([task_id], capabilities=NO_EXTENSION)
    assert reply.error["code"] == -32021


def test_listen_with_no_known_task_acks_nothing_and_ends(client):
    reply = client.listen(["unknown-1", "unknown-2"])
    assert [event["params"]["notifications"] for event in reply.events] == [{"taskIds": []}]
    assert reply.result["resultType"] == "complete"


# --- stats ------------------------------------------------------------------------------------------------------


def test_stats_count_polls_deliveries_and_cancels(client):
    task_id = client.call_tool("approval")["taskId"]
    client.wait_for_status(task_id, "input_required")
    before = client.stats()["polls"][task_id]
    client.get(task_id)
    client.call("tasks/update", {"taskId": task_id, "inputResponses": {"approve": {"action": "decline"}, "zzz": {}}})
    client.call("tasks/cancel", {"taskId": task_id})
    client.call("tasks/cancel", {"taskId": task_id})
    stats = client.stats()
    assert stats["polls"][task_id] == before + 1
    assert stats["deliveries"][f"{task_id}/approve"] == 1 and f"{task_id}/zzz" not in stats["deliveries"]
    assert stats["cancels"][task_id] == 2
    assert stats["max_concurrent_polls"][task_id] == 1


def test_stats_see_overlapping_polls_of_one_task():
    demo = DemoServer("--get-delay-ms", "300").start()
    try:
        client = HttpClient(demo.url)
        task_id = client.call_tool("long", {"seconds": 30})["taskId"]
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda _: HttpClient(demo.url).get(task_id), range(3)))
        assert client.stats()["max_concurrent_polls"][task_id] >= 2
    finally:
        demo.stop()


# --- options ----------------------------------------------------------------------------------------------------


def test_ttl_none_is_null_and_expired_tasks_are_invalid_params():
    unlimited = DemoServer("--ttl-ms", "none").start()
    short = DemoServer("--ttl-ms", "1500").start()
    try:
        created = HttpClient(unlimited.url).call_tool("progress", {"steps": 1, "step_ms": 10})
        assert_create_task_result(created)
        assert created["ttlMs"] is None
        assert_detailed_task(HttpClient(unlimited.url).wait_for_status(created["taskId"], "completed"))

        client = HttpClient(short.url)
        task_id = client.call_tool("long", {"seconds": 30})["taskId"]
        assert client.get(task_id)["ttlMs"] == 1500

        def refused():
            reply = client.request("tasks/get", {"taskId": task_id})
            return reply if "error" in reply.body else None

        reply = wait_until(
            refused,
            timeout=10,
            interval=0.1,
            what="the task expired 1.5 s after its creation",
        )
        assert reply.error == {"code": -32602, "message": "Failed to retrieve task: Task has expired"}
    finally:
        unlimited.stop()
        short.stop()


def test_require_token_refuses_requests_without_the_bearer_token(shared_demo_server_requiring_token):
    demo = shared_demo_server_requiring_token
    client = HttpClient(demo.url)
    assert client.request("server/discover").status == 401
    assert client.http.get(demo.url.removesuffix("/mcp") + "/demo/stats").status_code == 401
    client.http.headers["Authorization"] = "Bearer s3cret"
    assert client.call("server/discover")["capabilities"]["extensions"][TASKS] == {}
    client.close()


def test_conformance_flag_adds_the_fixture_tools():
    demo = DemoServer("--conformance").start()
    try:
        names = {tool["name"] for tool in HttpClient(demo.url).call("tools/list")["tools"]}
        fixtures = {"greet", "slow_compute", "failing_job", "protocol_error_job", "confirm_delete", "multi_input"}
        assert fixtures | {"test_tool_with_task", "quick", "progress"} <= names
    finally:
        demo.stop()


# --- durability -------------------------------------------------------------------------------------------------


def test_tasks_survive_a_restart_and_carry_on(tmp_path):
    state = str(tmp_path / "tasks.sqlite3")
    first = DemoServer("--state", state).start()
    client = HttpClient(first.url)
    short_id = client.call_tool("long", {"seconds": 2})["taskId"]
    long_id = client.call_tool("long", {"seconds": 60})["taskId"]
    approval_id = client.call_tool("approval", {"action": "restart"})["taskId"]
    client.wait_for_status(approval_id, "input_required")
    first.kill()

    second = DemoServer("--state", state).start()
    try:
        client = HttpClient(second.url)
        for task_id in (short_id, long_id):
            assert_detailed_task(client.get(task_id))
        assert client.get(long_id)["status"] == "working"
        assert text_of(client.wait_for_status(short_id, "completed")["result"]) == "finished after 2 s"
        assert_empty_ack(client.call("tasks/cancel", {"taskId": long_id}))
        assert client.wait_for_status(long_id, "cancelled", "completed")["status"] == "cancelled"
        answer = {"approve": {"action": "accept", "content": {"approved": True, "reason": "after restart"}}}
        client.call("tasks/update", {"taskId": approval_id, "inputResponses": answer})
        done = client.wait_for_status(approval_id, "completed")
        assert text_of(done["result"]) == "approved: restart (reason: after restart)"
    finally:
        second.stop()


# --- stdio ------------------------------------------------------------------------------------------------------


def test_stdio_serves_tasks_and_notifications():
    client = StdioClient("--poll-interval-ms", "100")
    try:
        created = client.call_tool("approval", {"action": "stdio"})
        assert_create_task_result(created)
        task_id = created["taskId"]
        asked = client.wait_for_status(task_id, "input_required")
        assert_detailed_task(asked)

        listen_id = 9_000
        client.write(
            {
                "jsonrpc": "2.0",
                "id": listen_id,
                "method": "subscriptions/listen",
                "params": {"notifications": {"taskIds": [task_id]}, "_meta": meta()},
            }
        )
        ack = client.next_message()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["_meta"] == {SUBSCRIPTION_ID: listen_id}
        current = client.next_message()
        assert_valid("TaskStatusNotification", current)
        assert current["params"]["status"] == "input_required"

        answer = {"approve": {"action": "accept", "content": {"approved": True}}}
        ack_reply = client.request("tasks/update", {"taskId": task_id, "inputResponses": answer})
        assert_empty_ack(ack_reply.result)
        statuses = [
            event["params"]["status"] for event in ack_reply.events if event.get("method") == "notifications/tasks"
        ]
        while not statuses or statuses[-1] != "completed":
            message = client.next_message()
            if message.get("id") == listen_id:
                break
            assert_valid("TaskStatusNotification", message)
            statuses.append(message["params"]["status"])
        assert statuses == ["working", "completed"]

        done = client.get(task_id)
        assert_detailed_task(done)
        assert text_of(done["result"]) == "approved: stdio (reason: )"
        cancelled_id = client.call_tool("long", {"seconds": 30})["taskId"]
        assert_empty_ack(client.call("tasks/cancel", {"taskId": cancelled_id}))
        assert_detailed_task(client.wait_for_status(cancelled_id, "cancelled"))
        failed = client.call_tool("fail")["taskId"]
        assert_detailed_task(client.wait_for_status(failed, "failed"))
    finally:
        client.close()


# --- the listening socket ---------------------------------------------------------------------------------------


async def accepted_socket_nodelay(listening) -> int:
    """Serve on `listening` as uvicorn does (asyncio's create_server); TCP_NODELAY of the connection it accepts."""
    accepted = asyncio.get_running_loop().create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            accepted.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    listening.bind(("127.0.0.1", 0))
    server = await asyncio.get_running_loop().create_server(Accept, sock=listening)
    try:
        _, writer = await asyncio.open_connection(*listening.getsockname())
        nodelay = await asyncio.wait_for(accepted, 5)
        writer.close()
        return nodelay
    finally:
        server.close()


async def test_the_demo_servers_connections_send_each_answer_without_waiting_for_an_ack():
    # A socket made without naming TCP keeps Nagle's algorithm on its connections: asyncio leaves them as they are.
    assert await accepted_socket_nodelay(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) == 0
    assert await accepted_socket_nodelay(tcp_socket()) != 0
