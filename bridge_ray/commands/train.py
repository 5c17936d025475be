"""``bridge-ray train``: build the actor graph on a Ray cluster (a local one by default) and run BRIDGE rounds."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bridge_ray.cli import add_config_arguments, config_from_args

HELP = "train the policy and the retriever adapter with BRIDGE rounds on the Ray actor graph"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")
    resume.add_argument(
        "--auto-resume", action="store_true",
        help="continue from the last complete checkpoint if there is one, else start (for resubmitted jobs)",
    )
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
    from bridge_ray.actors.placement import PlacementError
    from bridge_ray.train.coordinator import check_graph_resources, graph_bundles

    if args.dry_run:
        demand = json.dumps(graph_bundles(config))
        try:
            check_graph_resources(config, scale_up=False)
        except PlacementError as exc:
            if not config.run.autoscale_timeout_s:
                raise
            print(f"{exc}\nthe run will ask the autoscaler for it (run.autoscale_timeout_s): {demand}")
            return 0
        print(f"resource demand fits the cluster: {demand}")
        return 0
    check_graph_resources(config)

    import ray

    from bridge_ray.actors.coordinator import CoordinatorActor
    from bridge_ray.checkpoint import CheckpointManager, checkpoint_root

    run_dir = Path(config.run.output_dir)
    has_checkpoint = CheckpointManager(checkpoint_root(config), keep=1).latest() is not None
    resume = args.resume or (args.auto_resume and has_checkpoint)
    coordinator = CoordinatorActor.remote(config, resume=resume)
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
