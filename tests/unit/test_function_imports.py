"""Imports sit at the top of their module. The command line imports only the chosen command, so a module need not
hide its dependencies inside functions for ``--help``'s sake; an import left inside a function says why on its line
(an optional dependency, a real import cycle, a module that must load no torch)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_ray"
# Function-level imports with no reason on their line, today; lower it as they move up, never raise it.
LIMIT = 79


def unexplained_imports(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``path:line`` (relative to ``root``) of each import inside a function whose line carries no comment."""
    source = path.read_text()
    commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                 if tok.type == tokenize.COMMENT}
    found = []
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(function)
                      if isinstance(node, ast.Import | ast.ImportFrom) and node.lineno not in commented]
    return sorted(set(found))


def test_function_level_imports_stay_under_the_limit_and_none_in_the_command_line():
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in unexplained_imports(path)]
    assert len(found) <= LIMIT, f"{len(found)} function-level imports without a reason (limit {LIMIT}):\n" + \
        "\n".join(found)
    assert [line for line in found if line.startswith(("bridge_ray/bench/", "bridge_ray/commands/",
                                                      "bridge_ray/cli"))] == []


def test_a_reason_on_the_line_is_what_lets_an_import_stay(tmp_path):
    module = tmp_path / "bridge_ray" / "m.py"
    module.parent.mkdir()
    module.write_text("def f():\n    import vllm  # optional: an extra\n\n\ndef g():\n    import json\n")
    assert [line.split(":")[1] for line in unexplained_imports(module, tmp_path)] == ["6"]

