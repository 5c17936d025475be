"""``bridge-ray warmup``: the warm-up alone (the ``warmup.*`` section): cold-start SFT of the policy on
demonstration trajectories, so that RL starts from a policy that already searches and answers."""

from __future__ import annotations

import argparse

from bridge_ray.cli import add_config_arguments, config_from_args
from bridge_ray.train.preflight import warmup_preflight
from bridge_ray.warmup.trainer import warmed_up_policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", metavar="FILE", help="JSONL of trajectory or chat records (warmup.data)")
    parser.add_argument("--examples", type=int, help="demonstrations used (warmup.examples)")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {"warmup.data": args.data, "warmup.examples": args.examples})

    warmup_preflight(config)  # its files, before the policy loads
    path = warmed_up_policy(config)
    print(f"use it with: policy.model={path}")
    return 0
