"""The tests themselves, read as source: they wait for events instead of sleeping, and import one another one way.

- No `time.sleep` / `asyncio.sleep` of 0.5 s or more (a number, a module constant, or arithmetic of those) outside
  the helpers named in ALLOWED_SLEEPERS: a test waits for the event the sleep stood for (`tests.helpers.wait_until`),
  and where time passing is itself the subject it says so (`let_time_pass`). Sleeps whose length is a variable (a
  scripted server's delay, a helper's polling interval) are not judged here.
- A test module is imported as `tests.<module>` (`from tests.helpers import wait_until`), never by its bare name: a
  module imported both ways loads twice, with two copies of its state.
"""

import ast
import operator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LONGEST_SLEEP_SECONDS = 0.5  # a sleep this long or longer needs a reason
ALLOWED_SLEEPERS = {
    # Waits for a condition, polling at an interval.
    "helpers.py::wait_until",
    "test_load.py::wait_until_sockets_are_quiet",
    "test_load.py::wait_for_all_terminal",
    # Time passing is the subject, and the name says so.
    "helpers.py::let_time_pass",
    "helpers.py::let_time_pass_async",
}
SLEEP_MODULES = {"time", "asyncio"}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def files_under_tests() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            constants[node.target.id] = node.value
    return constants


def imported_test_constants(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Names imported from other test modules: name -> (module file, its name there)."""
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
            path = TESTS.joinpath(*node.module.split(".")[1:]).with_suffix(".py")
            for alias in node.names:
                imported[alias.asname or alias.name] = (str(path), alias.name)
    return imported


class Seconds:
    """The value of a sleep's argument where the source fixes it; None where it does not."""

    def __init__(self) -> None:
        self.trees: dict[str, ast.Module] = {}

    def tree(self, path: str) -> ast.Module:
        if path not in self.trees:
            self.trees[path] = ast.parse(Path(path).read_text())
        return self.trees[path]

    def of(self, node: ast.expr, path: str, depth: int = 0) -> float | None:
        if depth > 10:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = self.of(node.operand, path, depth + 1)
            return None if value is None else -value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = self.of(node.left, path, depth + 1), self.of(node.right, path, depth + 1)
            if left is None or right is None:
                return None
            return OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.Name):
            tree = self.tree(path)
            constants = module_constants(tree)
            if node.id in constants:
                return self.of(constants[node.id], path, depth + 1)
            imported = imported_test_constants(tree)
            if node.id in imported and Path(imported[node.id][0]).exists():
                source, name = imported[node.id]
                return self.of(ast.Name(id=name), source, depth + 1)
        return None


def sleep_names(tree: ast.Module) -> set[str]:
    """How this module can call a sleep by a bare name: `from time import sleep`, `from asyncio import sleep as s`."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in SLEEP_MODULES
        for alias in node.names
        if alias.name == "sleep"
    }


def is_sleep(call: ast.Call, bare_names: set[str]) -> bool:
    function = call.func
    if isinstance(function, ast.Attribute) and function.attr == "sleep":
        return isinstance(function.value, ast.Name) and function.value.id in SLEEP_MODULES
    return isinstance(function, ast.Name) and function.id in bare_names


def sleeps(path: Path, seconds: Seconds) -> list[tuple[int, str, float | None]]:
    """Every sleep call in the file: its line, the functions it is inside ("a.b"), and its length where fixed."""
    tree = seconds.tree(str(path))
    bare_names = sleep_names(tree)
    found = []

    def visit(node: ast.AST, within: tuple[str, ...]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            within = (*within, node.name)
        if isinstance(node, ast.Call) and is_sleep(node, bare_names):
            argument = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg), None)
            length = None if argument is None else seconds.of(argument, str(path))
            found.append((node.lineno, ".".join(within), length))
        for child in ast.iter_child_nodes(node):
            visit(child, within)

    visit(tree, ())
    return found


def allowed(path: Path, within: str) -> bool:
    relative = path.relative_to(TESTS).as_posix()
    return any(f"{relative}::{name}" in ALLOWED_SLEEPERS for name in within.split(".") if name)


def test_no_test_sleeps_half_a_second_or_more_outside_the_helpers_named_for_it():
    seconds = Seconds()
    long_sleeps, judged = [], []
    for path in files_under_tests():
        for line, within, length in sleeps(path, seconds):
            judged.append((path.name, within, length))
            if length is not None and length >= LONGEST_SLEEP_SECONDS and not allowed(path, within):
                long_sleeps.append(f"{path.relative_to(TESTS)}:{line} ({within or 'module'}): {length:g} s")
    assert not long_sleeps, "fixed sleeps of 0.5 s or more: wait for the event instead (tests.helpers.wait_until)\n" + (
        "\n".join(long_sleeps)
    )
    assert ("helpers.py", "let_time_pass", None) in judged  # the scan reads every file (its own probe: below)


def test_the_scan_finds_long_sleeps_of_numbers_constants_and_arithmetic():
    probe = TESTS / "helpers.py"
    source = (
        "import asyncio, time\nfrom time import sleep as nap\nPAUSE = 0.25\n"
        "def a():\n    time.sleep(0.5)\n"
        "async def b():\n    await asyncio.sleep(2 * PAUSE)\n"
        "def c():\n    nap(1)\n"
        "def d():\n    time.sleep(0.2)\n"
    )
    seconds = Seconds()
    seconds.trees[str(probe)] = ast.parse(source)
    found = {within: length for _, within, length in sleeps(probe, seconds)}
    assert found == {"a": 0.5, "b": 0.5, "c": 1.0, "d": 0.2}


def bare_imports_of_test_modules(path: Path, test_modules: set[str]) -> list[str]:
    bare = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in test_modules:
                bare.append(f"{path.relative_to(TESTS)}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            bare += [
                f"{path.relative_to(TESTS)}:{node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.split(".")[0] in test_modules
            ]
    return bare


def test_test_modules_are_imported_as_tests_dot_module_only():
    test_modules = {path.stem for path in files_under_tests()} - {"__init__"} | {"browser", "worker_jobs"}
    bare = [line for path in files_under_tests() for line in bare_imports_of_test_modules(path, test_modules)]
    assert not bare, "import test modules as tests.<module> (from tests.helpers import ...):\n" + "\n".join(bare)
    assert (TESTS / "__init__.py").exists(), "tests/ is a package: its modules are tests.<module>"


def test_make_user_is_defined_once():
    defined = [
        path.relative_to(TESTS).as_posix()
        for path in files_under_tests()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "make_user"
    ]
    assert defined == ["account_fixtures.py"], defined
