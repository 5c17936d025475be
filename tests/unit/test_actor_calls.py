"""Above ``bridge_ray/runtime`` no actor method is named by a string and no call's refs are read by position.

Each role's typed handle passes the actor class's own function to :class:`ActorGroup` (``Sampler.rollout``,
not ``"rollout"``) and names the refs a call returns with a frozen bundle (``call.out.trajectories``, not
``call.refs[1]``): renaming a method, or changing how many values it returns, then fails at import or in the
one handle that calls it, rather than in a round an hour into a run.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_ray"
RUNTIME = PACKAGE / "runtime"
# ActorGroup's calls, and the position of the method among their arguments.
METHOD_ARG = {"call": 1, "call_all": 0, "call_split": 0}


def contract_breaches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every method-name string passed to an actor-group call and every ``.refs[i]``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in METHOD_ARG:
            position = METHOD_ARG[node.func.attr]
            method = node.args[position] if len(node.args) > position else None
            if isinstance(method, ast.Constant) and isinstance(method.value, str):
                found.append((node.lineno, f".{node.func.attr}({method.value!r}, ...)"))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "refs":
            found.append((node.lineno, f".refs[{ast.unparse(node.slice)}]"))
    return found


def test_no_method_name_string_or_positional_ref_above_runtime():
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py")) if not path.is_relative_to(RUNTIME)
        for line, what in contract_breaches(ast.parse(path.read_text(), str(path)))
    ]
    assert wrong == [], "call the role's typed handle instead:\n" + "\n".join(wrong)


def test_the_scan_sees_a_method_name_and_a_positional_ref():
    """The check itself fires on each form, and passes the handles' form."""
    source = (
        'group.call(0, "rollout", part, num_returns=2)\n'
        'group.call_all("versions")\n'
        'group.call_split("evaluate", questions)\n'
        "trajectories = call.refs[1]\n"
        "group.call(0, Sampler.rollout, part, returns=RolloutRefs)\n"
        "trajectories = call.out.trajectories\n"
    )
    assert [line for line, _ in contract_breaches(ast.parse(source))] == [1, 2, 3, 4]
