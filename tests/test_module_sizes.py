"""The task services stay split by phase (issue 30, item 1): no module under taskhub/tasks/ grows past 450 lines,
the size at which the last one (services.py, 1,554 lines) stopped saying where a change belongs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "taskhub" / "tasks"
MAX_LINES = 450


def test_no_module_under_tasks_is_over_450_lines():
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in TASKS.rglob("*.py")
        if "migrations" not in path.parts
    }
    assert len(sizes) > 20
    assert {path: lines for path, lines in sizes.items() if lines > MAX_LINES} == {}
