"""``bridge-ray sft``: the warm-up stage alone — cold-start SFT of the policy on demonstration trajectories."""

from __future__ import annotations

import argparse

from bridge_ray.cli import add_config_arguments, config_from_args

HELP = "warm the policy up with SFT on demonstration trajectories (cached by content hash); prints its path"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", metavar="FILE", help="JSONL of trajectory or chat records (warmup.data)")
    parser.add_argument("--examples", type=int, help="demonstrations used (warmup.examples)")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {"warmup.data": args.data, "warmup.examples": args.examples})
    from bridge_ray.train.warmup import warmed_up_policy

    path = warmed_up_policy(config)
    print(f"use it with: policy.model={path}")
    return 0
