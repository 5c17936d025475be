"""``bridge-ray train``: build the actor graph on a Ray cluster (a local one by default) and run BRIDGE rounds."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bridge_ray.cli import add_config_arguments, config_from_args

HELP = "train the policy and the retriever adapter with BRIDGE rounds on the Ray actor graph"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")
    parser.add_argument(
        "--dry-run", action="store_true", help="validate keys, paths and the resource demand; load no model"
    )
    add_config_arguments(parser)


def connect(address: str | None) -> None:
    """Join ``address`` (or ``RAY_ADDRESS``, or a running local cluster), else start a local instance."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, dashboard_host="127.0.0.1", log_to_driver=True)


def write_table(run_dir: Path, name: str, table) -> None:
    (run_dir / f"{name}.md").write_text(table.to_markdown() + "\n")
    (run_dir / f"{name}.json").write_text(table.to_json() + "\n")
    print(f"\n## {name.replace('_', ' ')}\n\n{table.to_markdown()}\n", flush=True)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    from bridge_ray.train.preflight import preflight

    for line in preflight(config):
        print(line)
    connect(config.run.ray_address)
    from bridge_ray.train.coordinator import check_graph_resources, graph_bundles

    check_graph_resources(config)
    if args.dry_run:
        print("resource demand fits the cluster: " + json.dumps(graph_bundles(config)))
        return 0

    import ray

    from bridge_ray.actors.coordinator import CoordinatorActor
    from bridge_ray.checkpoint import checkpoint_root

    run_dir = Path(config.run.output_dir)
    coordinator = CoordinatorActor.remote(config, resume=args.resume)
    try:
        if config.eval.before_training:
            write_table(run_dir, "eval_before", ray.get(coordinator.evaluate.remote()))
        ray.get(coordinator.run.remote())
        if config.eval.after_training:
            write_table(run_dir, "eval_after", ray.get(coordinator.evaluate.remote()))
        state = ray.get(coordinator.state.remote())
    finally:
        ray.get(coordinator.shutdown.remote())
    checkpoint = checkpoint_root(config)
    print(
        f"done: {state['round']} rounds, policy v{state['policy_version']}, retriever v{state['retriever_version']}\n"
        f"checkpoints: {checkpoint.resolve()} (latest: {(checkpoint / 'latest').read_text().strip()})\n"
        f"logs: {run_dir.resolve()} (phases.jsonl, config.yaml, wandb/)"
    )
    return 0
