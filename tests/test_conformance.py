"""Acceptance: the demo server passes the MCP conformance suite's Tasks-extension scenarios, and
`python -m taskhub.mcp` passes its client scenarios on custom headers (SEP-2243) and, at the 2025-11-25 revision, on
initialization, tool calls, a classic elicitation's defaults (SEP-1034) and SSE retry.

Runs scripts/conformance.sh, which installs Node.js 22 and @modelcontextprotocol/conformance into .cache/
on first use (network needed once); `server` starts the demo server and runs each server scenario against it,
`client` lets the suite start each scenario's server and run scripts/conformance_client.py against it.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parent.parent
SCENARIOS = [
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
]
CLIENT_SCENARIOS = ["http-custom-headers", "http-invalid-tool-headers"]
# At the 2025-11-25 revision (issue 32): a classic elicitation answered with the form's defaults (SEP-1034), SSE
# resumption with Last-Event-ID and the server's retry time.
CLIENT_SCENARIOS_2025 = ["initialize", "tools_call", "elicitation-sep1034-client-defaults", "sse-retry"]


def run_conformance(mode: str, results: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "CONFORMANCE_RESULTS": str(results)}
    return subprocess.run(
        [str(PROJECT_DIR / "scripts" / "conformance.sh"), mode],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.conformance
@pytest.mark.slow
def test_demo_server_passes_the_tasks_conformance_scenarios(tmp_path):
    run = run_conformance("server", tmp_path / "conformance")
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    for scenario in SCENARIOS:
        assert f"PASS {scenario}:" in run.stdout, report


@pytest.mark.conformance
@pytest.mark.slow
def test_the_cli_passes_the_custom_header_and_2025_11_25_client_scenarios(tmp_path):
    run = run_conformance("client", tmp_path / "conformance")
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    for scenario in CLIENT_SCENARIOS + CLIENT_SCENARIOS_2025:
        assert f"PASS {scenario}:" in run.stdout, report
    # Each of the five defaults checked (not merely no check failed).
    (defaults,) = (tmp_path / "conformance" / "elicitation-sep1034-client-defaults").glob("*/checks.json")
    succeeded = {check["id"] for check in json.loads(defaults.read_text()) if check["status"] == "SUCCESS"}
    kinds = ("string", "integer", "number", "enum", "boolean")
    assert {f"client-elicitation-sep1034-{kind}-default" for kind in kinds} <= succeeded, succeeded

    # The suite sees only what reached its server; the command line said why it called nothing for the others.
    (client_output,) = (tmp_path / "conformance" / "http-invalid-tool-headers").glob("*/stdout.txt")
    output = client_output.read_text()
    calls = dict(re.findall(r"^\$ python -m taskhub.mcp call --url \S+ (\S+) .*\n-> exit (\d+)", output, re.M))
    assert calls.pop("valid_tool") == "0", output
    assert len(calls) == 11 and set(calls.values()) == {"4"}, calls
    assert output.count("x-mcp-header annotations are invalid (") == 11, output
