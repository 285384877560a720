"""Issue 5's newcomer path, end to end: `git clone`, then the README's one command, with nothing prepared.

No virtualenv in the clone, no DATABASE_URL, no Redis: `uv run taskhub demo` must create its environment,
start an embedded Postgres, the demo MCP server and a worker, and print the users' passwords; an approver
signs in over HTTP, an approval launched through the API reaches the inbox and completes after an answer
through the API; SIGINT leaves no Postgres behind.
"""

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import psutil
import pytest

from tests.conftest import PROJECT_DIR
from tests.helpers import free_port, wait_until
from tests.process_output import OutputLines
from tests.stack_fixtures import SignedIn, api_request

pytestmark = pytest.mark.slow

STARTUP_BUDGET_SECONDS = 90
FOREIGN_VARIABLES = ("DATABASE_URL", "REDIS_URL", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "TASKHUB_PGDATA", "DEBUG")


@pytest.fixture
def clone(tmp_path):
    target = tmp_path / "taskhub"
    subprocess.run(["git", "clone", "--quiet", str(PROJECT_DIR), str(target)], check=True)
    assert not (target / ".venv").exists()
    return target


def newcomer_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in FOREIGN_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def postgres_processes_under(directory) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            if process.info["name"] == "postgres" and str(directory) in " ".join(process.info["cmdline"] or ()):
                found.append(process)
        except psutil.Error:
            pass
    return found


def test_from_git_clone_to_an_approved_task_with_the_readme_command(clone):
    readme = (clone / "README.md").read_text()
    assert "uv run taskhub demo" in readme
    uv = shutil.which("uv")
    assert uv, "the README's command needs uv on PATH"
    port = free_port()
    data_dir = clone / "var"  # the demo's default: the clone is the test's own
    env = newcomer_env()
    started = time.monotonic()
    process = subprocess.Popen(
        [uv, "run", "taskhub", "demo", "--port", str(port)],
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = OutputLines(process)
    base = f"http://127.0.0.1:{port}"
    try:
        output.wait_for("taskhub is running at", STARTUP_BUDGET_SECONDS)
        with urllib.request.urlopen(f"{base}/accounts/login/", timeout=10) as response:
            assert response.status == 200 and "Sign in" in response.read().decode()
        elapsed = time.monotonic() - started
        assert elapsed < STARTUP_BUDGET_SECONDS, f"the login page took {elapsed:.0f} s"

        text = output.text
        passwords = dict(re.findall(r"User created: (\w+) / (\S+)", text))
        assert set(passwords) == {"admin", "operator", "approver"}, text
        assert "registered as server 'demo' with " in text, text
        # /metrics without a restart or a variable, from this machine (issue 34, item 9); the banner says where.
        assert f"• Metrics: {base}/metrics (from this machine only" in text, text
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            assert response.status == 200 and "taskhub_tasks_ended_24h" in response.read().decode()
        approver = SignedIn(base, "approver", passwords["approver"])

        # The README's command, as written there, in the same environment (no DEBUG, no SECRET_KEY).
        assert 'uv run taskhub manage create_api_token operator --name "my script"' in readme

        def token_for(username: str) -> str:
            made = subprocess.run(
                [uv, "run", "taskhub", "manage", "create_api_token", username, "--name", "my script"],
                cwd=clone,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert made.returncode == 0, made.stderr
            return made.stdout.strip()

        operator_token, approver_token = token_for("operator"), token_for("approver")
        status, task = api_request("POST", f"{base}/api/tasks", operator_token, {"server": "demo", "tool": "approval"})
        assert status == 201, task

        def inbox_with_the_question() -> str | None:
            inbox = approver.get("/inbox/")
            return inbox if task["id"] in inbox else None

        inbox = wait_until(inbox_with_the_question, timeout=30, what="the question in the inbox", interval=0.3)
        assert "Approve deploy?" in inbox
        request_id = int(re.search(r'id="ir-(\d+)"', inbox).group(1))
        status, body = api_request(
            "POST",
            f"{base}/api/input-requests/{request_id}/answer",
            approver_token,
            {"action": "accept", "content": {"approved": True, "reason": "first day"}},
        )
        assert status == 200, body

        def completed_task() -> dict | None:
            _, detail = api_request("GET", f"{base}/api/tasks/{task['id']}", operator_token)
            return detail if detail.get("status") == "completed" else None

        detail = wait_until(completed_task, timeout=60, what="the task completed", interval=0.3)
        assert detail["result"]["content"][0]["text"] == "approved: deploy (reason: first day)"
        assert postgres_processes_under(data_dir), "no embedded Postgres ran under the data directory"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 0, output.text[-3000:]
    wait_until(lambda: postgres_processes_under(data_dir) == [], timeout=10, what="the embedded Postgres stopped")
