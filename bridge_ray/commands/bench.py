"""``bridge-ray bench <name>``: benchmark scripts that print figures (ratios measured within one run)."""

from __future__ import annotations

import argparse

HELP = "run a benchmark and print its figures"

# name -> module of bridge_ray.bench defining add_arguments(parser) and run(args) -> int
BENCHMARKS: dict[str, str] = {
    "retrieval": "bridge_ray.bench.retrieval",
    "agent": "bridge_ray.bench.agent",
    "round": "bridge_ray.bench.round",
    "learn": "bridge_ray.bench.learn",
    "learner": "bridge_ray.bench.learner",
    "trl": "bridge_ray.bench.trl",
    "estimators": "bridge_ray.bench.estimators",
    "retriever-update": "bridge_ray.bench.retriever_update",
    "landscape": "bridge_ray.bench.landscape",
    "speed": "bridge_ray.bench.speed",
    "world": "bridge_ray.bench.world",
    "paired": "bridge_ray.bench.paired",
    "replay": "bridge_ray.bench.replay",
    "seeds": "bridge_ray.bench.seeds",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bridge_ray.cli import add_subcommands

    add_subcommands(parser, BENCHMARKS, "benchmark", "_bench")


def run(args: argparse.Namespace) -> int:
    return int(args._bench(args) or 0)

