"""Acceptance: the demo server passes the MCP conformance suite's Tasks-extension scenarios.

Runs scripts/conformance.sh, which installs Node.js 22 and @modelcontextprotocol/conformance into .cache/
on first use (network needed once), starts the demo server and runs each scenario against it.
"""

import os
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


@pytest.mark.conformance
@pytest.mark.slow
def test_demo_server_passes_the_tasks_conformance_scenarios(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CONFORMANCE_RESULTS": str(tmp_path / "conformance")}
    run = subprocess.run(
        [str(PROJECT_DIR / "scripts" / "conformance.sh")],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    for scenario in SCENARIOS:
        assert f"PASS {scenario}:" in run.stdout, report
