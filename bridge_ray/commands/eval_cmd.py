"""``bridge-ray eval``: greedy agent on QA files with a checkpoint's policy and retriever adapter.

``--suite mirage`` runs the paper's medical multiple-choice evaluation instead (``eval_mirage``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from bridge_ray.cli import add_config_arguments
from bridge_ray.config import Config, ConfigError, load_config
from bridge_ray.errors import InputError, refuse_unwritable

if TYPE_CHECKING:
    from bridge_ray.data.qa import QuestionRecord
    from bridge_ray.evaluation.table import QuestionOutcome
    from bridge_ray.rollout.sampler import Sampler

HELP = (
    "evaluate a checkpoint greedily on QA files and print the paper's table (EM, F1, cover-EM, recall); "
    "--suite mirage: medical multiple-choice QA (accuracy, judged reasoning)"
)
MIRAGE_FLAGS = ("benchmark", "sets", "judge", "overwrite")


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
    parser.add_argument("--out", metavar="FILE|DIR", help="qa: also write the table as JSON here; mirage: DIR")
    mirage = parser.add_argument_group("--suite mirage")
    mirage.add_argument("--benchmark", metavar="FILE", help="MIRAGE's benchmark.json")
    mirage.add_argument("--sets", metavar="A,B", help="sets to run (default: medqa,medmcqa,pubmedqa,bioasq,mmlu)")
    mirage.add_argument(
        "--judge", choices=["local", "openai", "none"], help="reasoning-quality judge (default: judge.backend)"
    )
    mirage.add_argument("--overwrite", action="store_true", help="write into a non-empty --out DIR")
    add_config_arguments(parser)


def _checkpoint_dir(path: str) -> Path:
    """The checkpoint ``path`` names (or the latest under it), checked whole, with a policy to evaluate."""
    from bridge_ray.checkpoint import POLICY_DIR, find_checkpoint

    return find_checkpoint(path, model=POLICY_DIR)[0]


def _check_max_questions(value: int | None) -> None:
    if value is not None and value < 1:
        raise InputError(f"--max-questions {value}: must be at least 1")


def run(args: argparse.Namespace) -> int:
    _check_max_questions(args.max_questions)
    if args.suite == "mirage":
        from bridge_ray.commands.eval_mirage import run_mirage

        return run_mirage(args)
    from bridge_ray.checkpoint import CONFIG, POLICY_DIR, retriever_adapter_dir
    from bridge_ray.train.inputs import eval_files
    from bridge_ray.train.preflight import eval_preflight

    _check_qa_flags(args)
    if args.out:  # written after the evaluation: a path that cannot take it fails now
        if Path(args.out).is_dir():
            raise InputError(f"--out {args.out} is a folder; the qa suite writes one JSON file there")
        refuse_unwritable(Path(args.out))
    checkpoint = _checkpoint_dir(args.checkpoint[0]) if args.checkpoint else None
    base = args.config or (checkpoint / CONFIG if checkpoint else None)
    overrides = list(args.overrides)
    for item in args.data:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--data {item!r}: expected NAME=PATH")
        overrides.append(f"data.eval.{name}={path}")
    if args.max_questions is not None:
        overrides.append(f"eval.max_questions={args.max_questions}")
    config = load_config(base, overrides)
    policy = str(checkpoint / POLICY_DIR) if checkpoint else None
    files, adapter = eval_files(config), retriever_adapter_dir(checkpoint)
    eval_preflight(config, files, policy, adapter)
    table = evaluate_policy(config, files, policy=policy, adapter=adapter)
    print(table.to_markdown())
    if args.out:
        Path(args.out).write_text(table.to_json() + "\n")
    return 0


def _check_qa_flags(args: argparse.Namespace) -> None:
    """The QA suite evaluates one checkpoint and takes none of the mirage flags."""
    if len(args.checkpoint) > 1:
        raise InputError("--checkpoint: the qa suite evaluates one checkpoint (--suite mirage takes several)")
    given = [f"--{flag}" for flag in MIRAGE_FLAGS if getattr(args, flag) not in (None, False)]
    if given:
        raise InputError(f"{', '.join(given)}: only with --suite mirage")


def load_eval_sets(config: Config, files: dict[str, str]) -> dict[str, list[QuestionRecord]]:
    """The first ``eval.max_questions`` questions of every file, read with the real loader: a missing or malformed
    file is an error naming it (and its line), before any model loads."""
    from bridge_ray.data.qa import load_questions

    for name, path in files.items():
        if not Path(path).is_file():
            raise InputError(f"data.eval.{name}: {path} is not a file")
    return {name: load_questions([path])[: config.eval.max_questions] for name, path in files.items()}


def evaluate_policy(config, files: dict[str, str], *, policy: str | None = None, adapter: Path | None = None):
    """Greedy agent in this process over ``config``'s index: ``policy`` weights (default ``policy.model``) and
    the retriever ``adapter`` (default: the base encoder), on the first ``eval.max_questions`` of each file."""
    from bridge_ray.evaluation.table import summarize

    question_sets = load_eval_sets(config, files)
    sampler = local_sampler(config, policy=policy, adapter=adapter)
    try:
        return summarize({name: evaluate_in_pieces(sampler, name, qs) for name, qs in question_sets.items()})
    finally:
        sampler.client.close()


def evaluate_in_pieces(sampler: Sampler, name: str, questions: list[QuestionRecord]) -> list[QuestionOutcome]:
    """``sampler.evaluate(questions)``, a large set cut into about ten pieces (:func:`pieces_per_worker`) so that
    its progress shows: a bar on a terminal, a line per tenth in logs."""
    from bridge_ray.progress import Progress, pieces_per_worker
    from bridge_ray.runtime.actor_group import split_evenly

    outcomes: list[QuestionOutcome] = []
    with Progress(len(questions), f"evaluation on {name}", "questions") as progress:
        for piece in split_evenly(questions, pieces_per_worker(len(questions), 1)):
            outcomes += sampler.evaluate(piece)
            progress.update(len(piece))
    return outcomes


def local_sampler(config: Config, *, policy: str | None = None, adapter: Path | None = None) -> Sampler:
    """A sampler in this process over ``config``'s index (``retrieval.index.dir``), with ``policy`` weights
    (default ``policy.model``) and the retriever ``adapter`` (default: the base encoder)."""
    from bridge_ray.retrieval.client import ShardSet
    from bridge_ray.rollout.sampler import Sampler
    from bridge_ray.train.inputs import index_dir

    return Sampler(
        config,
        ShardSet.local(index_dir(config), config.retrieval.encoder.spec()),
        seed=config.run.seed,
        adapter_dir=str(adapter) if adapter else None,
        model=policy,
    )
