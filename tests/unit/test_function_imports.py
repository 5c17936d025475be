"""Imports sit at the top of their module. The command line imports only the chosen command, so a module need not
hide its dependencies inside functions for ``--help``'s sake; an import left inside a function says why on its line
(an optional dependency, a real import cycle, a module that must load no torch or no model library)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_ray"
# Function-level imports in the package, and those with no reason on their line, today; lower them as they move
# up, never raise them.
LIMIT_TOTAL = 26
LIMIT = 0


def function_imports(path: Path, root: Path = PACKAGE.parent) -> dict[str, bool]:
    """``path:line`` (relative to ``root``) of each import inside a function -> whether its line carries a comment
    (the reason it stays there)."""
    source = path.read_text()
    commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                 if tok.type == tokenize.COMMENT}
    return {f"{path.relative_to(root)}:{node.lineno}": node.lineno in commented
            for function in ast.walk(ast.parse(source)) if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(function) if isinstance(node, ast.Import | ast.ImportFrom)}


def unexplained_imports(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``path:line`` (relative to ``root``) of each import inside a function whose line carries no comment."""
    return sorted(line for line, explained in function_imports(path, root).items() if not explained)


def test_function_level_imports_stay_under_the_limits_and_none_unexplained_in_the_command_line():
    found = {line: explained for path in sorted(PACKAGE.rglob("*.py")) for line, explained in
             function_imports(path).items()}
    unexplained = sorted(line for line, explained in found.items() if not explained)
    assert len(found) <= LIMIT_TOTAL, f"{len(found)} function-level imports (limit {LIMIT_TOTAL}):\n" + \
        "\n".join(sorted(found))
    assert len(unexplained) <= LIMIT, f"{len(unexplained)} function-level imports without a reason (limit {LIMIT}):\n" \
        + "\n".join(unexplained)
    assert [line for line in unexplained if line.startswith(("bridge_ray/bench/", "bridge_ray/commands/",
                                                             "bridge_ray/cli"))] == []


def test_a_reason_on_the_line_is_what_lets_an_import_stay(tmp_path):
    module = tmp_path / "bridge_ray" / "m.py"
    module.parent.mkdir()
    module.write_text("import os\n\n\ndef f():\n    import vllm  # optional: an extra\n\n\ndef g():\n    import json\n")
    assert function_imports(module, tmp_path) == {"bridge_ray/m.py:5": True, "bridge_ray/m.py:9": False}
    assert [line.split(":")[1] for line in unexplained_imports(module, tmp_path)] == ["9"]
