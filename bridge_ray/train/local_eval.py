"""Greedy evaluation in this process, without Ray: a checkpoint's policy and retriever adapter over the config's
index. ``eval`` (both suites) and the benches that score a trained policy share it."""

from __future__ import annotations

from pathlib import Path

from bridge_ray.checkpoint import POLICY_DIR, find_checkpoint
from bridge_ray.config import Config
from bridge_ray.coordinator.inputs import index_shards
from bridge_ray.data.qa import QuestionRecord, load_questions
from bridge_ray.errors import InputError
from bridge_ray.evaluation.table import EvalTable, QuestionOutcome, summarize
from bridge_ray.progress import Progress, pieces_per_worker
from bridge_ray.runtime.actor_group import split_evenly
from bridge_ray.sampler import sampler as sampling  # Sampler looked up when called: tests replace it


def policy_checkpoint(path: str) -> Path:
    """The checkpoint ``path`` names (or the latest under it), checked whole, with a policy to evaluate."""
    return find_checkpoint(path, model=POLICY_DIR)[0]


def load_eval_sets(config: Config, files: dict[str, str]) -> dict[str, list[QuestionRecord]]:
    """The first ``eval.max_questions`` questions of every file, read with the real loader: a missing or malformed
    file is an error naming it (and its line), before any model loads."""
    for name, path in files.items():
        if not Path(path).is_file():
            raise InputError(f"data.eval.{name}: {path} is not a file")
    return {name: load_questions([path])[: config.eval.max_questions] for name, path in files.items()}


def evaluate_policy(
    config: Config, files: dict[str, str], *, policy: str | None = None, adapter: Path | None = None
) -> EvalTable:
    """Greedy agent in this process over ``config``'s index: ``policy`` weights (default ``policy.model``) and
    the retriever ``adapter`` (default: the base encoder), on the first ``eval.max_questions`` of each file."""
    question_sets = load_eval_sets(config, files)
    sampler = local_sampler(config, policy=policy, adapter=adapter)
    try:
        return summarize({name: evaluate_in_pieces(sampler, name, qs) for name, qs in question_sets.items()})
    finally:
        sampler.client.close()


def evaluate_in_pieces(sampler: sampling.Sampler, name: str, questions: list[QuestionRecord]) -> list[QuestionOutcome]:
    """``sampler.evaluate(questions)``, a large set cut into about ten pieces (:func:`pieces_per_worker`) so that
    its progress shows: a bar on a terminal, a line per tenth in logs."""
    outcomes: list[QuestionOutcome] = []
    with Progress(len(questions), f"evaluation on {name}", "questions") as progress:
        for piece in split_evenly(questions, pieces_per_worker(len(questions), 1)):
            outcomes += sampler.evaluate(piece)
            progress.update(len(piece))
    return outcomes


def local_sampler(config: Config, *, policy: str | None = None, adapter: Path | None = None) -> sampling.Sampler:
    """A sampler in this process over ``config``'s index (``retrieval.index.dir``), with ``policy`` weights
    (default ``policy.model``) and the retriever ``adapter`` (default: the base encoder)."""
    return sampling.Sampler(
        config,
        index_shards(config),
        seed=config.run.seed,
        adapter_dir=str(adapter) if adapter else None,
        model=policy,
    )
