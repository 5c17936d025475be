"""Imports point down the layers: a package uses only what is listed before it.

The order is the architecture (docs/architecture.md, "Package layout"): disk locations (the cache, where models
load from), pure math and the typed configuration first (the config names the math's variants and nothing above
it), then the Ray plumbing every role shares, the data and retrieval stack, the agent, then the roles (the shard
holders, which the samplers and the retriever learner call; the samplers and the two learners, peers that import
none of each other: what they exchange lies below them), the evaluation tables, the coordinator's round loop that
drives them all, the warm-up (which reads the coordinator's inputs), the job, what benchmarks and sweeps report
(figures, tables, device measures), then two peers: the sweeps of runs on top of the job and the probes of the
objectives on one batch of rollouts, and the command line on top (``cli`` parses and holds the shared flags; the
benchmarks use them; it loads ``commands`` and they load the benchmarks by name). Imports under ``if
TYPE_CHECKING:`` are annotations only and do not count. Nor do modules import each other, through any chain (within
a layer too).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_ray"

# Bottom to top; a tuple holds peers, which may import what is listed before the tuple but not each other.
LAYERS: list[str | tuple[str, ...]] = [
    "errors", "records", "atomic", "progress", "fresh_process", "cache", "cache_key", "model_paths", "algo", "config",
    "runtime", "data", "retrieval", "engines", "agent", "checkpoint", "telemetry", "shard_holder",
    ("sampler", "retriever_learner", "policy_learner"), "evaluation", "coordinator", "warmup", "train", "reporting",
    ("sweep", "probes"), "cli_types", "cli", "bench", "commands", "__main__",
]
UNITS = {unit for entry in LAYERS for unit in ((entry,) if isinstance(entry, str) else entry)}


def _rank(unit: str) -> int:
    return next(i for i, entry in enumerate(LAYERS) if unit == entry or (isinstance(entry, tuple) and unit in entry))


def _unit(path: Path) -> str:
    """The layer a source file belongs to: its top-level package or module under ``bridge_ray``."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every absolute import that runs, wherever it sits (functions included), in source order."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if (isinstance(node, ast.ImportFrom) and node.module and node.level == 0) or isinstance(node, ast.Import):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _runtime_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every ``bridge_ray`` import that runs, wherever it sits (functions included)."""
    found: list[tuple[int, str]] = []
    for node in _runtime_import_nodes(tree):
        if isinstance(node, ast.ImportFrom):
            found.append((node.lineno, str(node.module)))
        else:
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, module) for line, module in found if module.startswith("bridge_ray.")]


def wrong_imports(sources: dict[Path, ast.AST]) -> list[str]:
    """Each import of a unit above the importer's, or of a peer of it (``path:line: unit imports module``)."""
    wrong = []
    for path, tree in sources.items():
        unit = _unit(path)
        for line, module in _runtime_imports(tree):
            target = module.split(".")[1]
            if target != unit and _rank(target) >= _rank(unit):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {unit} imports {module}")
    return wrong


def test_every_package_and_module_has_a_layer():
    units = {_unit(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert units <= UNITS, f"add to LAYERS: {sorted(units - UNITS)}"


def test_no_import_points_up_or_to_a_peer():
    sources = {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}
    assert wrong_imports(sources) == []


@pytest.mark.parametrize(("unit", "source", "why"), [
    ("config/schema.py", "from bridge_ray.retrieval.presets import PRESETS", "the config sits below retrieval"),
    ("config/schema.py", "from bridge_ray.algo.choices import Aggregation", None),  # algo is below: allowed
    ("policy_learner/learner.py", "from bridge_ray.retriever_learner.learner import RetrievalRows", "a peer role"),
    ("sampler/sampler.py", "from bridge_ray.evaluation.outcomes import question_outcome", "evaluation is above"),
    ("runtime/placement.py", "def f():\n    from bridge_ray.train.job import connect\n", "train is above"),
])
def test_the_walk_sees_the_edges_that_were_removed(unit, source, why):
    """The edges the layers exclude are found: the config's on retrieval's presets, the policy learner's on the
    retriever learner's rows, the sampler's on the evaluation's outcomes, the runtime's on the job."""
    found = wrong_imports({PACKAGE / unit: ast.parse(source)})
    assert bool(found) == (why is not None), found


def test_runtime_names_no_layer_above_it():
    """The plumbing every role shares relies on nothing a higher layer sets up: a docstring naming a module above
    it (``train/job.py``'s runtime environment, once) says it does. What it needs is set in it (``init_ray``)."""
    above = "|".join(sorted((u for u in UNITS if _rank(u) > _rank("runtime")), key=len, reverse=True))
    named = re.compile(rf"\bbridge_ray[./]({above})\b|\b({above})/\w+\.py\b")
    found = [f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
             for path in sorted((PACKAGE / "runtime").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if named.search(line)]
    assert found == []
    assert named.search("(``train/job.py``'s ``HIDE_UNRESERVED_GPUS``)"), "the check itself fires"


def test_importing_the_config_loads_no_torch():
    """The config sits below everything that reads it, and costs no more than pydantic and PyYAML to import (the
    math's variants it names are in ``algo/choices.py``, without torch): ~1 s instead of ~8 s on a busy 2-core
    machine, paid by every command before it checks its flags."""
    import subprocess
    import sys

    code = "import sys, bridge_ray.config; print([m for m in ('torch', 'ray', 'transformers') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


def test_the_walk_sees_an_upward_import():
    """The check itself fires: a function-level import of a higher layer is found, a TYPE_CHECKING one is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from bridge_ray.coordinator.coordinator import Coordinator\n"
        "def f():\n    from bridge_ray.policy_learner.learner import PolicyLearnerGroup\n"
    )
    found = _runtime_imports(ast.parse(source))
    assert found == [(5, "bridge_ray.policy_learner.learner")]


def _module(path: Path) -> str:
    """The dotted name of a source file under ``bridge_ray`` (a package's ``__init__`` is the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, ast.AST]) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` its runtime imports load (:func:`_runtime_import_nodes`).

    ``from pkg import name`` loads the submodule ``pkg.name`` when there is one, else ``pkg``. The parent packages
    Python loads before a submodule are not edges: a package is entered before its submodules, so its
    ``__init__`` importing them closes no cycle; a submodule importing its package's ``__init__`` by name does.
    """
    graph: dict[str, set[str]] = {}
    for module, tree in sources.items():
        loaded: set[str] = set()
        for node in _runtime_import_nodes(tree):
            if isinstance(node, ast.Import):
                loaded.update(alias.name for alias in node.names)
            else:
                loaded.update(
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in sources else str(node.module)
                    for alias in node.names
                )
        graph[module] = {target for target in loaded if target in sources and target != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle for each group of modules that import each other (a strongly connected component of more than
    one module): the shortest path from the group's first module back to it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = {stack.pop()}
            while module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(_shortest_cycle(graph, min(group), group) for group in groups)


def _shortest_cycle(graph: dict[str, set[str]], start: str, group: set[str]) -> list[str]:
    """The shortest path ``start`` -> ... -> ``start`` within ``group`` (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph[module] & group):
                if target == start:
                    path = [module]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if target not in previous:
                    previous[target] = module
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in no cycle of {sorted(group)}")


def test_no_import_cycles():
    """Modules that import each other load half-initialised, in an order that depends on which is imported first."""
    sources = {_module(path): ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}
    assert [" -> ".join(cycle) for cycle in import_cycles(import_graph(sources))] == []


def test_the_walk_sees_a_cycle_through_a_function_level_import():
    """The check itself fires: ``a`` and ``b`` import each other (``b`` inside a function, and as ``from bridge_ray
    import a``); ``c`` imports ``a`` only under TYPE_CHECKING, so ``a -> c`` closes no cycle."""
    sources = {
        "bridge_ray": ast.parse(""),
        "bridge_ray.a": ast.parse("import bridge_ray.c\nfrom bridge_ray.b import f\n"),
        "bridge_ray.b": ast.parse("def f():\n    from bridge_ray import a\n"),
        "bridge_ray.c": ast.parse("import typing\nif typing.TYPE_CHECKING:\n    from bridge_ray.a import f\n"),
    }
    assert import_cycles(import_graph(sources)) == [["bridge_ray.a", "bridge_ray.b", "bridge_ray.a"]]


def _defined_names(tree: ast.AST) -> set[str]:
    """The names a module binds at its top level: definitions, assignments and imports (``if``/``try`` bodies too)."""
    names: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            body.extend([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                         *(s for h in getattr(node, "handlers", []) for s in h.body)])
    return names


def missing_names(sources: dict[str, ast.AST]) -> list[str]:
    """``module: name`` for each ``from bridge_ray.x import name`` (function-level ones too, which only fail when
    their function runs) where ``x`` neither defines ``name`` nor has a submodule of that name."""
    defined = {module: _defined_names(tree) for module, tree in sources.items()}
    missing = []
    for module, tree in sources.items():
        for node in _runtime_import_nodes(tree):
            if isinstance(node, ast.ImportFrom) and node.module in sources:
                missing += [f"{module}:{node.lineno}: {node.module} has no {alias.name}" for alias in node.names
                            if alias.name not in defined[node.module] and f"{node.module}.{alias.name}" not in sources]
    return missing


def test_every_imported_name_exists():
    """A name moved to another module breaks the imports inside functions only when those run (a bench's
    ``from bridge_ray.commands.train import connect`` did, after ``connect`` moved to ``train/job.py``)."""
    sources = {_module(path): ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}
    assert missing_names(sources) == []


def test_the_walk_sees_a_name_that_moved():
    sources = {
        "bridge_ray.a": ast.parse("X = 1\nif True:\n    def f(): ...\n"),
        "bridge_ray.b": ast.parse("def g():\n    from bridge_ray.a import X, f, gone\n"),
    }
    assert missing_names(sources) == ["bridge_ray.b:2: bridge_ray.a has no gone"]


def test_the_job_driver_and_the_coordinator_start_without_the_model_libraries():
    """They build no model; transformers, peft, DeepSpeed and vLLM cost each of them ~10 s at every job start."""
    import subprocess
    import sys

    code = ("import sys, bridge_ray.train.job, bridge_ray.coordinator.handle; "
            "print(sorted(m for m in ('transformers', 'peft', 'deepspeed', 'vllm') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]
