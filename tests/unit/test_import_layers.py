"""Imports point down the layers: a package uses only what is listed before it.

The order is the architecture (README, "Code layout"): disk locations (the cache, where models load from) and
pure math first, then the Ray plumbing every role shares, the data and retrieval stack, the agent, then the roles
(rollout, retriever, policy), the training loop that drives them, and the command line on top (``cli`` parses; it
loads ``commands`` by name). Imports under ``if TYPE_CHECKING:`` are annotations only and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_ray"

LAYERS = [
    "errors", "atomic", "progress", "fresh_process", "cache", "model_paths", "algo", "runtime", "data", "retrieval",
    "config", "engines", "agent", "evaluation", "checkpoint", "telemetry", "rollout", "retriever", "policy", "train",
    "cli", "commands", "__main__",
]


def _unit(path: Path) -> str:
    """The layer a source file belongs to: its top-level package or module under ``bridge_ray``."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every ``bridge_ray`` import that runs, wherever it sits (functions included)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return [(line, module) for line, module in found if module.startswith("bridge_ray.")]


def upward_imports() -> list[str]:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = _unit(path)
        for line, module in _runtime_imports(ast.parse(path.read_text(), str(path))):
            target = module.split(".")[1]
            if target != unit and LAYERS.index(target) > LAYERS.index(unit):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {unit} imports {module}")
    return wrong


def test_every_package_and_module_has_a_layer():
    units = {_unit(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert units <= set(LAYERS), f"add to LAYERS: {sorted(units - set(LAYERS))}"


def test_no_import_points_up():
    assert upward_imports() == []


def test_the_walk_sees_an_upward_import():
    """The check itself fires: a function-level import of a higher layer is found, a TYPE_CHECKING one is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from bridge_ray.train.coordinator import Coordinator\n"
        "def f():\n    from bridge_ray.policy.learner import PolicyLearnerGroup\n"
    )
    found = _runtime_imports(ast.parse(source))
    assert found == [(5, "bridge_ray.policy.learner")]
