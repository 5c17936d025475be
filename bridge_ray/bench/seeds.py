"""``bench seeds``: the results reports' headline figure, redrawn from kept ``bench learn`` results.json files
alone, so that anyone can check it against the tables: each seed's paired difference and the pooled one."""

from __future__ import annotations

import argparse
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from bridge_ray.bench.figures import plot_paired_seeds
from bridge_ray.cli import add_out_argument
from bridge_ray.errors import InputError
from bridge_ray.records import read_record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("groups", nargs="+", metavar="LABEL=results.json",
                        help="a bench learn results.json per group of seeds, with its label in the figure")
    parser.add_argument("--treated", default="bridge", help="the preset whose gain is drawn (default bridge)")
    parser.add_argument("--baseline", default="fixed", help="the preset it is paired against (default fixed)")
    parser.add_argument("--set", default="gap", dest="set_name", help="the evaluation set (default gap)")
    add_out_argument(parser, "file", "the figure", required=True, metavar="FILE.png")


class _Row(BaseModel):
    model_config = ConfigDict(extra="allow")  # the figures this bench does not draw


class PairedRow(_Row):
    """A ``paired`` row of results.json: one preset minus its baseline on a set, for a seed or over them."""

    preset: str
    baseline: str
    set: str
    seed: int | Literal["all"]
    diff_em: float
    ci_low: float
    ci_high: float
    diff_recall_at_3: float | None
    recall_ci_low: float | None
    recall_ci_high: float | None


class FinalRow(_Row):
    """A ``final`` row: a preset's (or the oracle's, seed null) scores on a set at its last round."""

    preset: str
    seed: int | None
    set: str
    em: float
    recall_at_3: float | None


class LearnResults(_Row):
    """What this bench reads of a ``bench learn`` results.json."""

    paired: list[PairedRow]
    final: list[FinalRow]


def read_groups(items: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """``LABEL=results.json`` items, each file read through :class:`LearnResults` before anything is drawn."""
    groups = []
    for item in items:
        label, sep, file = item.rpartition("=")
        if not sep or not label:
            raise InputError(f"{item!r}: expected LABEL=results.json")
        groups.append((label, read_record(file, LearnResults, "a bench learn results.json").model_dump()))
    return groups


def run(args: argparse.Namespace) -> int:
    groups = read_groups(args.groups)
    try:
        plot_paired_seeds(groups, args.out, treated=args.treated, baseline=args.baseline, set_name=args.set_name)
    except (KeyError, ValueError) as exc:
        raise InputError(f"{' '.join(args.groups)}: {exc}") from exc
    print(f"wrote {args.out}")
    return 0
