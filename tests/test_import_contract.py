"""The import contract in pyproject.toml ([tool.importlinter]) holds, and it would catch an import that breaks it.

DESIGN.md, "Dependency direction": the domain never imports the worker or the live layer, the protocol package
knows nothing of Django. lint-imports (import-linter) reads every import, those inside functions too.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(project: Path) -> subprocess.CompletedProcess:
    """lint-imports on the taskhub package found under `project`, with that project's pyproject.toml."""
    args = [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(project / "pyproject.toml")]
    # PYTHONPATH comes before the editable install of the real checkout, so a copy's package is the one analysed.
    env = {**os.environ, "PYTHONPATH": str(project)}
    return subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contract_is_kept():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


# (module, an import appended to it, what lint-imports then reports): each against one rule of the design.
OFFENCES = [
    # Hidden in a function, as hooks.py once imported the jobs: still an import.
    (
        "taskhub/tasks/hooks.py",
        "def _enqueue():\n    from taskhub.worker import jobs",
        "taskhub.tasks.hooks -> taskhub.worker.jobs",
    ),
    (
        "taskhub/tasks/services/answering.py",
        "from taskhub.live import publish",
        "taskhub.tasks.services.answering -> taskhub.live.publish",
    ),
    ("taskhub/accounts/apps.py", "from taskhub.live import access", "taskhub.accounts.apps -> taskhub.live.access"),
    ("taskhub/live/nav.py", "from taskhub.worker import sweeps", "taskhub.live.nav -> taskhub.worker.sweeps"),
    (
        "taskhub/servers/models.py",
        "from taskhub.tasks import queries",
        "taskhub.servers.models -> taskhub.tasks.queries",
    ),
    ("taskhub/mcp/wire.py", "from django.db import models", "taskhub.mcp.wire -> django"),
    ("taskhub/demo/store.py", "from taskhub.mcp import wire", "taskhub.demo.store -> taskhub.mcp.wire"),
    (
        "taskhub/live/task_fragments.py",
        "from taskhub.tasks.views.listing import visible_task_or_404",
        "taskhub.live.task_fragments -> taskhub.tasks.views.listing",
    ),
    (
        "taskhub/tasks/presenters.py",
        "from taskhub.tasks.views import listing",
        "taskhub.tasks.presenters -> taskhub.tasks.views.listing",
    ),
]
CONTRACTS = [
    "Each layer imports only the layers below it",
    "Services, models, the domain's hooks and the live layer never import a page",
    "The protocol and the demo server import no Django and no other taskhub package",
]


def test_the_contract_breaks_on_imports_against_the_design(tmp_path):
    shutil.copytree(ROOT / "taskhub", tmp_path / "taskhub", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for module, offending_import, _ in OFFENCES:
        with (tmp_path / module).open("a") as source:
            source.write(f"\n\n{offending_import}\n")

    run = lint_imports(tmp_path)

    assert run.returncode == 1, run.stdout + run.stderr
    output = " ".join(run.stdout.split())  # lint-imports wraps long lines
    for contract in CONTRACTS:
        assert f"{contract} BROKEN" in output, output
    for _, _, reported in OFFENCES:
        assert reported in output, f"{reported} not reported:\n{run.stdout}"
