"""``bridge-ray cluster-check``: one short round of the config's graph on the Ray cluster, to see that it runs there
before a long job does: where each role landed and how many bytes each phase moved between nodes.

The round is a real one (the config's placement, models, index and questions), driven from this process: the
coordinator runs here, so the run folder it writes is a temporary one, removed afterwards, and no checkpoint is
taken. The bytes are those of the object refs one actor's output is handed to an actor on another node by
(:mod:`bridge_ray.runtime.traffic`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from ray._private.state import actors

from bridge_ray.atomic import write_text_atomic
from bridge_ray.cli import add_config_arguments, add_out_argument, config_from_args
from bridge_ray.config import Config, derive
from bridge_ray.coordinator.capacity import require_graph_capacity
from bridge_ray.coordinator.coordinator import Coordinator
from bridge_ray.coordinator.graph import graph_bundles
from bridge_ray.runtime import traffic
from bridge_ray.train.preflight import preflight
from bridge_ray.train.run import connect

# The phases that hand refs between actors, in a round's order (reward runs on the coordinator alone).
MEMORY = ("memory", "object_store_memory")  # bytes, not what a role asks for: left out of the printed nodes
REPORTED_PHASES = ("rollout", "score", "retriever_update", "lower_retriever_update", "policy_update", "sync")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", metavar="ADDR",
                        help="the Ray cluster to check (run.ray_address); default: RAY_ADDRESS, else a local Ray")
    add_out_argument(parser, "file", "the report as JSON: nodes, each role's actors and node, bytes per phase")
    add_config_arguments(parser)


def check_config(config: Config, run_dir: Path) -> Config:
    """``config`` for one round written under ``run_dir``: no evaluation, no checkpoint, no W&B run."""
    return derive(config, {
        "run.output_dir": str(run_dir), "run.rounds": 2,  # one round of two: the last round would checkpoint
        "checkpoint.every_rounds": 1_000_000,
        "eval.every_rounds": 0, "eval.before_training": False, "eval.after_training": False,
        "telemetry.wandb_mode": "disabled", "telemetry.ray_metrics": False,
    }, source="cluster-check")


@contextmanager
def _scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bridge-ray-cluster-check-"))
    try:
        yield path / "run"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {"run.ray_address": args.address})

    for line in preflight(config):
        print(line)
    connect(config.run.ray_address)
    require_graph_capacity(config)
    with _scratch() as run_dir:
        report = check_round(check_config(config, run_dir))
    print(format_report(report))
    if args.out:
        write_text_atomic(Path(args.out), json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    if not report["healthy"]:
        print(f"error: cluster-check: {report['failure']}", file=sys.stderr, flush=True)
        return 1
    return 0


def check_round(config: Config) -> dict[str, Any]:
    """Start the graph, run one round recording what crosses between nodes, stop the graph; the report (with
    ``healthy`` False and the ``failure`` where the graph did not start or the round failed)."""
    report: dict[str, Any] = {"nodes": nodes(), "healthy": False}
    try:
        coordinator = Coordinator(config)
    except Exception as exc:  # a role that cannot start: the report says so
        report["failure"] = f"the graph did not start: {_first_line(exc)}"
        return report
    try:
        report["roles"] = roles(config)
        if missing := [f"{role} ({len(r['actors'])} of {r['count']} actors alive)"
                       for role, r in report["roles"].items() if len(r["actors"]) != r["count"]]:
            report["failure"] = f"roles short of actors: {', '.join(missing)}"
            return report
        with traffic.recording("rollout") as ledger:
            coordinator.phases = _LedgerPhases(coordinator.phases, ledger)
            started = time.time()
            try:
                figures = coordinator.run_round(total=1)
            except Exception as exc:
                report["failure"] = f"the round failed in phase {ledger.phase}: {_first_line(exc)}"
                return report
            crossings = ledger.crossings()
        report |= {
            "round_seconds": round(time.time() - started, 1),
            "phase_seconds": {r.phase: round(r.seconds, 2) for r in coordinator.phases.records},
            "retriever_turns": int(figures.get("retriever/turns", 0)),
            "bytes_between_nodes": traffic.bytes_by_phase(crossings, REPORTED_PHASES),
            "crossings": [vars(c) for c in crossings],
            "healthy": True,
        }
    finally:
        coordinator.shutdown()
    return report


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class _LedgerPhases:
    """The coordinator's phase recorder, telling the ledger which phase the calls sent next belong to."""

    def __init__(self, recorder: Any, ledger: Any) -> None:
        self._recorder, self._ledger = recorder, ledger

    @contextmanager
    def phase(self, round_index: int, name: str, **info: Any) -> Iterator[dict]:
        self._ledger.phase = name
        with self._recorder.phase(round_index, name, **info) as record:
            yield record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._recorder, name)


def nodes() -> list[dict[str, Any]]:
    """The cluster's live nodes: id, IP address and the resources each declares."""
    return [{"node_id": n["NodeID"], "ip": n["NodeManagerAddress"],
             "resources": {k: v for k, v in sorted(n["Resources"].items()) if not k.startswith("node:")}}
            for n in ray.nodes() if n.get("Alive")]


def roles(config: Config) -> dict[str, dict[str, Any]]:
    """Each role of the graph running now: the bundle each of its actors reserved, and its actors' nodes (from the
    GCS's actor table: this job's live actors, named ``<role>-<index>``)."""
    job_id = ray.get_runtime_context().get_job_id()
    placed: dict[str, list[dict[str, str]]] = {}
    for actor in actors().values():
        name = actor.get("Name") or ""
        if actor["State"] != "ALIVE" or actor["JobID"] != job_id or "-" not in name:
            continue
        role = name.rsplit("-", 1)[0].replace("-", "_")
        placed.setdefault(role, []).append(
            {"actor": name, "node_id": actor["Address"]["NodeID"], "ip": actor["Address"]["IPAddress"]})
    return {role: {"count": len(bundles), "bundle": bundles[0],
                   "actors": sorted(placed.get(role, []), key=lambda a: a["actor"])}
            for role, bundles in graph_bundles(config).items()}


def format_report(report: dict[str, Any]) -> str:
    """The report as the command prints it: nodes, roles and their nodes, bytes between nodes per phase."""
    short = {n["node_id"]: f"{n['node_id'][:8]} ({n['ip']})" for n in report["nodes"]}
    lines = [f"nodes: {len(report['nodes'])}"]
    for n in report["nodes"]:
        amounts = ", ".join(f"{k} {v:g}" for k, v in n["resources"].items() if k not in MEMORY)
        lines.append(f"  {short[n['node_id']]}: {amounts}")
    if "roles" in report:
        lines.append("roles:")
        width = max(len(role) for role in report["roles"])
        for role, placed in report["roles"].items():
            bundle = ", ".join(f"{k} {v:g}" for k, v in sorted(placed["bundle"].items()))
            where = ", ".join(f"{a['actor']} on {short.get(a['node_id'], a['node_id'][:8])}" for a in placed["actors"])
            lines.append(f"  {role.ljust(width)}  {{{bundle}}} each: {where or 'no actor alive'}")
    if "bytes_between_nodes" in report:
        turns = report["retriever_turns"]
        lines.append(f"round: {report['round_seconds']:g} s, {turns} searches for the retriever update")
        lines.append("bytes between nodes (object refs handed from actor to actor):")
        for phase, size in report["bytes_between_nodes"].items():
            if phase not in report["phase_seconds"]:
                continue  # a phase this round did not run (lower_retriever_update outside two-state)
            routes: dict[tuple[str, str], int] = {}
            for c in report["crossings"]:
                if c["phase"] == phase:
                    routes[c["source"], c["target"]] = routes.get((c["source"], c["target"]), 0) + c["bytes"]
            lines.append(f"  {phase.ljust(22)} {size:>14,d}")
            lines += [f"    {short[a][:8]} -> {short[b][:8]} {n:>14,d}" for (a, b), n in routes.items()]
        lines.append(f"  {'total'.ljust(22)} {sum(report['bytes_between_nodes'].values()):>14,d}")
    if report["healthy"]:
        lines.append("cluster-check: healthy")
    return "\n".join(lines)
