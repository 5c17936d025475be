"""Above ``bridge_ray/runtime`` every role is started and called through its typed handle, and nothing waits on Ray
without a limit.

Each role's typed handle (the ``handle`` module of its package) passes the actor class's own function to
:class:`ActorGroup` (``Sampler.rollout``, not ``"rollout"``) and reads the refs of a call with several returns by
the names of the NamedTuple its method returns, declared beside the method (``call.out.trajectories``, not
``call.refs[1]``): renaming a method, or reordering what it returns, then fails at import or in the one handle that
calls it, rather than in a round an hour into a run. Only ``bridge_ray/runtime`` touches Ray's calls itself
(``.remote``, ``ray.remote``), and a ``ray.get`` or ``ray.wait`` anywhere else names its ``timeout=``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_ray"
RUNTIME = PACKAGE / "runtime"
# ActorGroup's calls, and the position of the method among their arguments.
METHOD_ARG = {"call": 1, "call_all": 0, "call_split": 0}
# Every role and the module of its typed handle.
HANDLES = {
    "coordinator": "coordinator/handle.py",
    "shard_holder": "shard_holder/handle.py",
    "sampler": "sampler/handle.py",
    "retriever_learner": "retriever_learner/handle.py",
    "policy_learner": "policy_learner/handle.py",
}


def contract_breaches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every method-name string passed to an actor-group call, every ``.refs[i]``, every Ray call
    made directly (``.remote``, ``ray.remote``: the string dispatch ``getattr(actor, name).remote`` among them),
    every ``ray.get``/``ray.wait`` without ``timeout=``, and every ``returns=`` bundle imported from another module
    than its method's class."""
    found = []
    imported = {alias.asname or alias.name: node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in METHOD_ARG:
            position = METHOD_ARG[node.func.attr]
            method = node.args[position] if len(node.args) > position else None
            if isinstance(method, ast.Constant) and isinstance(method.value, str):
                found.append((node.lineno, f".{node.func.attr}({method.value!r}, ...)"))
            returns = next((k.value for k in node.keywords if k.arg == "returns"), None)
            if (isinstance(method, ast.Attribute) and isinstance(method.value, ast.Name)
                    and isinstance(returns, ast.Name)
                    and imported.get(returns.id, "here") != imported.get(method.value.id, "here")):
                found.append((node.lineno, f"returns={returns.id} not declared beside {ast.unparse(method)}"))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "refs":
            found.append((node.lineno, f".refs[{ast.unparse(node.slice)}]"))
        elif isinstance(node, ast.Attribute) and node.attr == "remote":
            found.append((node.lineno, f"{ast.unparse(node)} (a Ray call outside runtime)"))
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) in ("ray.get", "ray.wait")
              and not any(k.arg == "timeout" for k in node.keywords)):
            found.append((node.lineno, f"{ast.unparse(node.func)}(...) without timeout="))
    return found


def test_no_ray_call_method_name_string_or_positional_ref_above_runtime():
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py")) if not path.is_relative_to(RUNTIME)
        for line, what in contract_breaches(ast.parse(path.read_text(), str(path)))
    ]
    assert wrong == [], "call the role's typed handle (or a bridge_ray.runtime helper) instead:\n" + "\n".join(wrong)


def test_the_scan_sees_each_breach_and_passes_the_handles_form():
    """The check itself fires on each form, and passes the handles' form."""
    source = (
        "from bridge_ray.sampler.sampler import Sampler\n"
        "from bridge_ray.sampler.handle import RolloutReturns\n"
        'group.call(0, "rollout", part, num_returns=2)\n'
        'group.call_all("versions")\n'
        'group.call_split("evaluate", questions)\n'
        "trajectories = call.refs[1]\n"
        "refs = [getattr(s, method.__name__).remote(*a) for s in shards]\n"
        "ray.get(coordinator.run.remote())\n"
        "ray.remote(num_cpus=1)(Host)\n"
        "ray.wait(refs, num_returns=2)\n"
        "group.call(0, Sampler.rollout, part, returns=RolloutReturns)\n"
        "ray.get(refs, timeout=limit)\n"
        "ray.wait(refs, num_returns=2, timeout=limit)\n"
        "trajectories = call.out.trajectories\n"
    )
    lines = [line for line, _ in contract_breaches(ast.parse(source))]
    assert sorted(set(lines)) == [3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert lines.count(8) == 2, "ray.get without timeout, and the .remote inside it"
    beside = "from bridge_ray.sampler.sampler import RolloutReturns, Sampler\n" + source.splitlines()[10]
    assert contract_breaches(ast.parse(beside)) == []


def test_every_role_has_a_typed_handle_module():
    """Each role's handle module names its role and restart policy and is where its actors are called from."""
    for role, module in HANDLES.items():
        path = PACKAGE / module
        assert path.is_file(), f"role {role}: no handle module {module}"
        text = path.read_text()
        assert f'ROLE = "{role}"' in text and "RESTART = Restart." in text, f"{module}: ROLE and RESTART of {role}"
    packages = {p.parent.name for p in PACKAGE.glob("*/handle.py")}
    assert packages == set(HANDLES), "every role is a package with a handle module, the coordinator too"
