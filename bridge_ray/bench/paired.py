"""``bridge-ray bench paired``: treated − baseline on the same questions, from two arms' evaluation files.

Each file is an ``eval_<label>.json`` a run writes (``train`` or ``eval``), which keeps every question's EM and
recall. Give one file per seed on each side, in the same seed order; the difference of each data set is averaged
over the seeds, with a 95% bootstrap interval over seeds and questions from three seeds on, over questions alone
(the seeds averaged first) with fewer, as its ``interval`` says; each seed's own difference follows, with its
interval over questions (``bridge_ray/evaluation/paired.py``). For two runs of ``train`` from one policy, the
warm-up's ``eval_before.json`` is the baseline of its ``eval_after.json``.
"""

from __future__ import annotations

import argparse
from typing import Any

from bridge_ray.cli import add_out_argument
from bridge_ray.errors import InputError, Problems
from bridge_ray.evaluation.paired_report import paired_markdown, paired_rows
from bridge_ray.evaluation.table import read_table
from bridge_ray.reporting.figures import write_figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", nargs="+", required=True, metavar="FILE", help="eval_*.json, one per seed")
    parser.add_argument("--treated", nargs="+", required=True, metavar="FILE", help="eval_*.json, same seed order")
    add_out_argument(parser, "file", "also write the rows as JSON")


def read_questions(path: str) -> dict[str, dict[str, list]]:
    """The per-question records of every data set of one evaluation file, checked against its schema
    (:func:`bridge_ray.evaluation.table.read_table`): a damaged file is refused naming the file and the field."""
    questions = read_table(path).questions
    if not questions:
        raise InputError(f"{path}: questions holds no data set; expected the eval_*.json of a run or of eval --out")
    return questions


def read_all(baseline: list[str], treated: list[str]) -> tuple[list[dict], list[dict]]:
    """Every file's records, each file checked: the problems of all of them are listed at once."""
    problems, read = Problems(), {}
    for path in dict.fromkeys([*baseline, *treated]):
        with problems.check():
            read[path] = read_questions(path)
    problems.raise_any()
    return [read[p] for p in baseline], [read[p] for p in treated]


def paired_table(baseline: list[str], treated: list[str]) -> list[dict[str, Any]]:
    """One row per data set that every file evaluated: questions, seeds, the paired figures with ``interval`` (what
    their intervals resample) and, with several seeds, ``per_seed``: each seed's figures, in --baseline's order."""
    if len(baseline) != len(treated):
        raise InputError(f"--baseline has {len(baseline)} files and --treated {len(treated)}: one per seed on each")
    base, treat = read_all(baseline, treated)
    try:
        rows = paired_rows(base, treat)
    except ValueError as e:
        raise InputError(f"{e} ({', '.join(baseline)} vs {', '.join(treated)})") from None
    if not rows:
        raise InputError("the baseline and treated files share no data set")
    return rows


def run(args: argparse.Namespace) -> int:
    rows = paired_table(args.baseline, args.treated)
    print(paired_markdown(rows))
    if args.out:
        write_figures(args.out, {"paired": rows})
    return 0
