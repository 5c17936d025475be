"""``bench seeds``: the results reports' headline figure, redrawn from kept ``bench learn`` results.json files
alone, so that anyone can check it against the tables: each seed's paired difference and the pooled one."""

from __future__ import annotations

import argparse
from typing import Any

from bridge_ray.cli import add_out_argument
from bridge_ray.errors import InputError
from bridge_ray.reporting.figures import plot_paired_seeds, wrote
from bridge_ray.sweep.results import read_results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("groups", nargs="+", metavar="LABEL=results.json",
                        help="a bench learn results.json per group of seeds, with its label in the figure")
    parser.add_argument("--treated", default="bridge", help="the preset whose gain is drawn (default bridge)")
    parser.add_argument("--baseline", default="fixed", help="the preset it is paired against (default fixed)")
    parser.add_argument("--set", default="gap", dest="set_name", help="the evaluation set (default gap)")
    add_out_argument(parser, "file", "the figure", required=True, metavar="FILE.png")


def read_groups(items: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """``LABEL=results.json`` items, each file read and checked before anything is drawn."""
    groups = []
    for item in items:
        label, sep, file = item.rpartition("=")
        if not sep or not label:
            raise InputError(f"{item!r}: expected LABEL=results.json")
        groups.append((label, read_results(file)))
    return groups


def run(args: argparse.Namespace) -> int:
    groups = read_groups(args.groups)
    try:
        plot_paired_seeds(groups, args.out, treated=args.treated, baseline=args.baseline, set_name=args.set_name)
    except (KeyError, ValueError) as exc:
        raise InputError(f"{' '.join(args.groups)}: {exc}") from exc
    wrote([args.out])
    return 0
