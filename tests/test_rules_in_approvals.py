"""The approval rules are decided in taskhub/approvals/ alone (issue 30, item 2).

Outside it, code may read the terms a policy gives (to show "2 of 3", to name the policy, to act on a gate already
decided) but never decide with them: no comparison, condition or arithmetic on N of M, self-approval, the comment on a
decline, the answer deadline or what happens at it. accounts/permissions.py only declares the terms and the fail-closed
answers of the registry the task services ask.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "taskhub"
# api/policies.py checks what an admin writes into a policy (a known at_deadline), which decides no request.
ALLOWED = {PACKAGE / "approvals", PACKAGE / "accounts" / "permissions.py", PACKAGE / "api" / "policies.py"}
# The terms a rule is decided with. gate_before_call is left out: whether a tool is gated is the policy's (approvals
# builds the terms); the services act on the decided flag.
RULE_TERMS = {"required_accepts", "self_approval", "comment_on_decline", "answer_within", "at_deadline"}
DECIDING = (ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp)


def _modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts and not any(path == a or a in path.parents for a in ALLOWED)
    )


def decisions_in(source: str) -> list[str]:
    """Each use of a rule's term that decides something: inside a comparison, a condition, arithmetic or `not`."""
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr in RULE_TERMS):
            continue
        child, parent = node, parents.get(node)
        while parent is not None and not isinstance(parent, ast.stmt | ast.FormattedValue | ast.keyword | ast.Dict):
            if isinstance(parent, DECIDING) or (
                isinstance(parent, ast.IfExp | ast.comprehension) and child is not getattr(parent, "body", None)
            ):
                found.append(f"line {node.lineno}: {ast.unparse(parent)[:100]}")
                break
            child, parent = parent, parents.get(parent)
        if isinstance(parent, ast.If | ast.While | ast.Assert) and child is parent.test:
            found.append(f"line {node.lineno}: {ast.unparse(parent.test)[:100]}")
    return found


def test_no_approval_rule_is_decided_outside_approvals():
    modules = _modules()
    assert PACKAGE / "tasks" / "services" / "answering.py" in modules or PACKAGE / "tasks" / "services.py" in modules
    decided = {str(path.relative_to(ROOT)): decisions_in(path.read_text()) for path in modules}
    assert {path: found for path, found in decided.items() if found} == {}


@pytest.mark.parametrize(
    "source",
    [
        "if terms.required_accepts > 1: pass",
        "enough = len(accepted) >= terms.required_accepts",
        "if not terms.self_approval and mine: refuse()",
        "if terms.comment_on_decline: ask()",
        "deadline = opened + terms.answer_within",
        "then = 'x' if policy.at_deadline == 'escalate' else 'y'",
        "while terms.answer_within: pass",
    ],
)
def test_each_kind_of_decision_is_found(source):
    assert decisions_in(source)


@pytest.mark.parametrize(
    "source",
    [
        "card.required_accepts = terms.required_accepts",
        "outcome(required=terms.required_accepts)",
        "data = {'required': terms.required_accepts}",
        "words = f'{terms.required_accepts} of them'",
        "if terms.gate_before_call: gate()",
    ],
)
def test_reading_a_term_to_show_or_pass_it_on_is_not_a_decision(source):
    assert not decisions_in(source)
