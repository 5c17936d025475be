"""``bridge-ray bench <name>``: benchmark scripts that print figures (ratios measured within one run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HELP = "run a benchmark and print its figures"

# name -> module defining add_arguments(parser) and run(args) -> int
BENCHMARKS: dict[str, str] = {
    "retrieval": "bridge_ray.commands.bench_retrieval",
    "agent": "bridge_ray.commands.bench_agent",
    "round": "bridge_ray.commands.bench_round",
    "learn": "bridge_ray.commands.bench_learn",
    "learner": "bridge_ray.commands.bench_learner",
    "trl": "bridge_ray.commands.bench_trl",
    "estimators": "bridge_ray.commands.bench_estimators",
    "retriever-update": "bridge_ray.commands.bench_retriever_update",
    "landscape": "bridge_ray.commands.bench_landscape",
    "speed": "bridge_ray.commands.bench_speed",
    "world": "bridge_ray.commands.bench_world",
    "paired": "bridge_ray.commands.bench_paired",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bridge_ray.cli import add_subcommands

    add_subcommands(parser, BENCHMARKS, "benchmark", "_bench")


def run(args: argparse.Namespace) -> int:
    return int(args._bench(args) or 0)


def write_figures(path: str | Path, figures: dict[str, Any]) -> None:
    """``--out``: every benchmark's figures as one JSON document, written atomically."""
    from bridge_ray.atomic import write_text_atomic

    write_text_atomic(Path(path), json.dumps(figures, indent=2) + "\n")
