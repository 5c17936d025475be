"""``bridge-ray eval``: greedy agent on QA files with a checkpoint's policy and retriever adapter."""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge_ray.cli import add_config_arguments
from bridge_ray.config import ConfigError, load_config

HELP = "evaluate a checkpoint greedily on QA files and print the paper's table (EM, F1, cover-EM, recall)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", metavar="DIR", help="a checkpoint directory (or a run's checkpoint root)")
    parser.add_argument(
        "--data", action="append", default=[], metavar="NAME=PATH", help="a question file to evaluate (repeatable)"
    )
    parser.add_argument("--max-questions", type=int, help="first N questions of each file (eval.max_questions)")
    parser.add_argument("--out", metavar="FILE", help="also write the table as JSON here")
    add_config_arguments(parser)


def _checkpoint_dir(path: str) -> Path:
    from bridge_ray.checkpoint import CheckpointManager

    directory = Path(path)
    if not (directory / "manifest.json").is_file():
        latest = CheckpointManager(directory, keep=1).latest()
        if latest is None:
            raise ConfigError(f"--checkpoint {path}: neither a checkpoint nor a directory of checkpoints")
        directory = latest
    return directory


def run(args: argparse.Namespace) -> int:
    checkpoint = _checkpoint_dir(args.checkpoint) if args.checkpoint else None
    base = args.config or (checkpoint / "config.yaml" if checkpoint else None)
    overrides = list(args.overrides)
    for item in args.data:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--data {item!r}: expected NAME=PATH")
        overrides.append(f"data.eval.{name}={path}")
    if args.max_questions:
        overrides.append(f"eval.max_questions={args.max_questions}")
    config = load_config(base, overrides)

    from bridge_ray.train.inputs import eval_files
    from bridge_ray.train.retriever_update import ADAPTER_DIR

    adapter = checkpoint / ADAPTER_DIR if checkpoint and (checkpoint / ADAPTER_DIR).is_dir() else None
    table = evaluate_policy(
        config, eval_files(config), policy=str(checkpoint / "policy") if checkpoint else None, adapter=adapter
    )
    print(table.to_markdown())
    if args.out:
        Path(args.out).write_text(table.to_json() + "\n")
    return 0


def evaluate_policy(config, files: dict[str, str], *, policy: str | None = None, adapter: Path | None = None):
    """Greedy agent in this process over ``config``'s index: ``policy`` weights (default ``policy.model``) and
    the retriever ``adapter`` (default: the base encoder), on the first ``eval.max_questions`` of each file."""
    from bridge_ray.actors.sampler import Sampler
    from bridge_ray.data.qa import load_questions
    from bridge_ray.evaluation.table import summarize
    from bridge_ray.retrieval.client import ShardSet
    from bridge_ray.train.inputs import index_dir

    sampler = Sampler(
        config,
        ShardSet.local(index_dir(config), config.retrieval.encoder.spec()),
        seed=config.run.seed,
        adapter_dir=str(adapter) if adapter else None,
        model=policy,
    )
    try:
        return summarize({
            name: sampler.evaluate(load_questions([path])[: config.eval.max_questions]) for name, path in files.items()
        })
    finally:
        sampler.client.close()
