"""Acceptance: the demo server passes the MCP conformance suite's Tasks-extension scenarios, and
`python -m taskhub.mcp` passes its client scenarios on custom headers (SEP-2243) and, at the 2025-11-25 revision, on
initialization, tool calls, a classic elicitation's defaults (SEP-1034) and SSE retry; and every client `auth/`
scenario of the 2026-07-28 revision and the client-credentials extension scenarios, authorizing by OAuth (issue 33).

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


# Issue 33: every auth scenario of the 2026-07-28 revision, and the client-credentials extension scenarios.
AUTH_SCENARIOS = [
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/authorization-server-migration",
    "auth/iss-supported",
    "auth/iss-not-advertised",
    "auth/iss-supported-missing",
    "auth/iss-wrong-issuer",
    "auth/iss-unexpected",
    "auth/iss-normalized",
    "auth/metadata-issuer-mismatch",
    "auth/client-credentials-jwt",
    "auth/client-credentials-basic",
]
# What the scenarios hand the client (MCP_CONFORMANCE_CONTEXT): never printed by the command line.
CONTEXT_SECRETS = ["conformance-test-secret", "pre-registered-secret", "PRIVATE KEY"]


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


@pytest.mark.conformance
@pytest.mark.slow
def test_the_cli_passes_the_auth_scenarios(tmp_path):
    run = run_conformance("auth", tmp_path / "conformance")
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    for scenario in AUTH_SCENARIOS:
        assert f"PASS {scenario}:" in run.stdout, report

    # Where the server or its authorization server misbehaves, the command line refused, and said why.
    outputs = {
        scenario: "".join(path.read_text() for path in (tmp_path / "conformance" / scenario).rglob("std*.txt"))
        for scenario in AUTH_SCENARIOS
    }
    assert "Authorization response iss mismatch" in outputs["auth/iss-wrong-issuer"]
    assert "metadata issuer mismatch" in outputs["auth/metadata-issuer-mismatch"]
    assert "does not match expected" in outputs["auth/resource-mismatch"]
    assert "refused the authorization it granted: HTTP 403 insufficient_scope" in outputs["auth/scope-retry-limit"]
    assert "-> exit 0" in outputs["auth/scope-step-up"]
    # A person's way (--oauth): the URL to open printed, the browser's redirect taken on the loopback listener.
    assert "open this URL in a browser" in outputs["auth/basic-cimd"] and "-> exit 0" in outputs["auth/basic-cimd"]
    # No token or secret in anything the command line printed (the suite's tokens are its own; a bearer header never).
    for scenario, output in outputs.items():
        assert "Bearer " not in output and "access_token" not in output, scenario
        assert not [secret for secret in CONTEXT_SECRETS if secret in output], scenario
