"""``bridge-ray bench <name>``: benchmark scripts that print figures (ratios measured within one run)."""

from __future__ import annotations

import argparse
import importlib

HELP = "run a benchmark and print its figures"

# name -> module defining add_arguments(parser) and run(args) -> int
BENCHMARKS: dict[str, str] = {
    "retrieval": "bridge_ray.commands.bench_retrieval",
    "agent": "bridge_ray.commands.bench_agent",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="<benchmark>", required=True)
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_bench=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args._bench(args) or 0)
