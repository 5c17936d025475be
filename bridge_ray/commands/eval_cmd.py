"""``bridge-ray eval``: greedy agent on QA files with a checkpoint's policy and retriever adapter.

``--suite mirage`` runs the paper's medical multiple-choice evaluation instead (``eval_mirage``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge_ray.atomic import write_text_atomic
from bridge_ray.checkpoint import CONFIG, POLICY_DIR, retriever_adapter_dir
from bridge_ray.cli import OutKind, add_config_arguments, add_out_argument
from bridge_ray.commands.eval_mirage import run_mirage
from bridge_ray.config import ConfigError, load_config
from bridge_ray.config.schema import DATASET_NAME
from bridge_ray.coordinator.inputs import eval_files
from bridge_ray.errors import InputError
from bridge_ray.train import local_eval
from bridge_ray.train.local_eval import policy_checkpoint
from bridge_ray.train.preflight import eval_preflight

MIRAGE_FLAGS = ("benchmark", "sets", "judge")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--suite", choices=["qa", "mirage"], default="qa", help="qa: --data files; mirage: MIRAGE's benchmark.json"
    )
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="DIR",
        help="a checkpoint directory (or a run's checkpoint root); mirage: repeatable, LABEL=DIR names its row",
    )
    parser.add_argument(
        "--data", action="append", default=[], metavar="NAME=PATH", help="a question file to evaluate (repeatable)"
    )
    parser.add_argument("--max-questions", type=int, help="first N questions of each file or set")
    add_out_argument(
        parser, _out_kind, "qa: a file, the table as JSON; mirage (required): a folder, the responses, judgments and "
        "table", metavar="FILE|DIR", what="an evaluation",
        remedy="choose another --out, or pass --overwrite to write there",
        overwrite="qa: replace the --out file; mirage: write into a non-empty --out DIR",
    )
    mirage = parser.add_argument_group("--suite mirage")
    mirage.add_argument("--benchmark", metavar="FILE", help="MIRAGE's benchmark.json")
    mirage.add_argument("--sets", metavar="A,B", help="sets to run (default: medqa,medmcqa,pubmedqa,bioasq,mmlu)")
    mirage.add_argument(
        "--judge", choices=["local", "openai", "none"],
        help="which judge scores the reasoning (judge.backend, its default); none: no judging"
    )
    add_config_arguments(parser)


def _out_kind(args: argparse.Namespace) -> OutKind:
    """The qa suite writes one table, mirage a folder of them."""
    return "folder" if args.suite == "mirage" else "file"


def _check_max_questions(value: int | None) -> None:
    if value is not None and value < 1:
        raise InputError(f"--max-questions {value}: must be at least 1")


def run(args: argparse.Namespace) -> int:
    _check_max_questions(args.max_questions)
    if args.suite == "mirage":
        return run_mirage(args)

    _check_qa_flags(args)
    checkpoint = policy_checkpoint(args.checkpoint[0]) if args.checkpoint else None
    base = args.config or (checkpoint / CONFIG if checkpoint else None)
    overrides = [*args.overrides, *(f"data.eval.{name}={path}" for name, path in data_sets(args.data).items())]
    if args.max_questions is not None:
        overrides.append(f"eval.max_questions={args.max_questions}")
    config = load_config(base, overrides)
    policy = str(checkpoint / POLICY_DIR) if checkpoint else None
    files, adapter = eval_files(config), retriever_adapter_dir(checkpoint)
    eval_preflight(config, files, policy, adapter)
    table = local_eval.evaluate_policy(config, files, policy=policy, adapter=adapter)
    print(table.to_markdown())
    if args.out:
        write_text_atomic(Path(args.out), table.to_json() + "\n")
    return 0


def data_sets(items: list[str]) -> dict[str, str]:
    """``--data NAME=PATH`` flags as name -> path, each name a data-set name given once."""
    sets: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--data {item!r}: expected NAME=PATH")
        if not DATASET_NAME.fullmatch(name):
            raise ConfigError(f"--data {item!r}: the name {name!r} is not a data-set name: use letters, digits, '_' "
                              "and '-'")
        if name in sets:
            raise ConfigError(f"--data: the name {name!r} is given twice ({sets[name]} and {path}); name each file "
                              "once")
        sets[name] = path
    return sets


def _check_qa_flags(args: argparse.Namespace) -> None:
    """The QA suite evaluates one checkpoint and takes none of the mirage flags."""
    if len(args.checkpoint) > 1:
        raise InputError("--checkpoint: the qa suite evaluates one checkpoint (--suite mirage takes several)")
    given = [f"--{flag}" for flag in MIRAGE_FLAGS if getattr(args, flag) not in (None, False)]
    if given:
        raise InputError(f"{', '.join(given)}: only with --suite mirage")
