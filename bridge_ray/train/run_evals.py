"""A run's evaluations: which it makes (:func:`run_evaluations`), the files it writes them to, the tables kept in
the cache for a run's start, and ``eval.worlds``, evaluated in a Ray task between graphs.

The graph's own evaluations are asked of the run's coordinator (:meth:`bridge_ray.train.run.Run.evaluate`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bridge_ray.config import Config, derive
from bridge_ray.coordinator.graph_eval import append_eval_record
from bridge_ray.coordinator.inputs import eval_files, index_dir
from bridge_ray.evaluation.cache import cached_table
from bridge_ray.evaluation.table import EvalTable, read_table
from bridge_ray.runtime.calls import run_task
from bridge_ray.train import local_eval


class Evaluation(NamedTuple):
    """One of a run's evaluations: its files (``<name>.md`` / ``.json``), its column in the stage table and its
    label in ``eval.jsonl``."""

    name: str
    column: str
    label: str


EVAL_BEFORE = Evaluation("eval_before", "base", "before")
EVAL_WARMUP = Evaluation("eval_warmup", "warm-up", "warmup")
EVAL_AFTER = Evaluation("eval_after", "after RL", "after")
EVALUATIONS = (EVAL_BEFORE, EVAL_WARMUP, EVAL_AFTER)


@dataclass(frozen=True)
class RunEvaluations:
    """The evaluations a run makes: the base policy's, through a graph of its own before the warm-up (``base``),
    and the training graph's before and after the rounds; None where it makes none."""

    base: Evaluation | None
    before: Evaluation | None
    after: Evaluation | None


def run_evaluations(config: Config, resume: bool) -> RunEvaluations:
    """``eval.before_training`` evaluates the policy the rounds start from (the warmed-up one with the warm-up,
    and the base policy first unless ``eval.base_policy`` is false) unless the run resumes;
    ``eval.after_training`` the policy they end with."""
    before, warmup = config.eval.before_training and not resume, config.warmup.enabled
    return RunEvaluations(
        base=EVAL_BEFORE if before and warmup and config.eval.base_policy else None,
        before=(EVAL_WARMUP if warmup else EVAL_BEFORE) if before else None,
        after=EVAL_AFTER if config.eval.after_training else None,
    )


def write_table(run_dir: Path, name: str, table: EvalTable) -> None:
    (run_dir / f"{name}.md").write_text(table.to_markdown() + "\n")
    (run_dir / f"{name}.json").write_text(table.to_json() + "\n")
    print(f"\n## {name.replace('_', ' ')}\n\n{table.to_markdown()}\n", flush=True)


def learner_rank_options(config: Config) -> dict[str, Any]:
    """The Ray options of a task that takes one policy learner rank's resources (and node pool)."""
    rank = config.roles.policy_learner
    return {"num_cpus": rank.cpus, "num_gpus": rank.gpus, "resources": rank.resources}


def kept_graph_table(
    config: Config, run_dir: Path, evaluation: Evaluation, evaluate: Callable[[], EvalTable]
) -> EvalTable:
    """``evaluate()``: the graph's evaluation of ``config``'s policy before any round, or the table an earlier run
    kept where the policy and index are cache entries (:mod:`bridge_ray.evaluation.cache`; the base model and the
    warm-up, 7 of the warm demo's 25 minutes). A kept table is appended to ``eval.jsonl`` as the graph appends
    its own: a key exists only for a run's start, round 0 with both versions 0."""
    table, kept = cached_table(config, eval_files(config), config.policy.model, config.retrieval.encoder.adapter,
                               index_dir(config), "graph", lambda: json.loads(evaluate().to_json()))
    if kept:
        append_eval_record(run_dir, EvalTable.from_json(table), label=evaluation.label, round=0, policy_version=0,
                           retriever_version=0)
    return EvalTable.from_json(table)


def world_config(config: Config, world: str) -> Config:
    """``config`` on the bundled ``world``: its held-out split over its own index, the first
    ``eval.worlds_max_questions`` of it (else ``eval.max_questions``). Its ``eval.worlds`` is empty (``world`` is
    its own) and its holders one per shard the world's index is built with."""
    limit = config.eval.worlds_max_questions or config.eval.max_questions
    return derive(config, {
        "data.world": world, "data.eval": {}, "eval.worlds": [], "eval.max_questions": limit,
        "retrieval.index.dir": None, "roles.shard_holder.count": None,
    }, source=f"eval.worlds: {world}")


def build_indexes(config: Config) -> None:
    """The run's index and those of ``eval.worlds``, built into the cache where they are not yet (else found),
    so that the run's timings show the build as a step of its own."""
    for each in (config, *(world_config(config, world) for world in config.eval.worlds)):
        index_dir(each)


def other_worlds(config: Config, policy: str, adapter: str | None) -> list[EvalTable]:
    """The held-out splits of ``eval.worlds``, each over its own index, greedily by ``policy`` with the query
    ``adapter``, in a Ray task with one learner rank's resources (so it runs while no graph holds them); a cached
    policy's with the base retriever kept in the cache root (:mod:`bridge_ray.evaluation.cache`)."""
    if not config.eval.worlds:
        return []

    def evaluate_worlds(config: Config, policy: str, adapter: str | None) -> list[EvalTable]:
        tables = []
        for world in config.eval.worlds:
            on_world = world_config(config, world)
            files = eval_files(on_world)
            table, _ = cached_table(on_world, files, policy, adapter, index_dir(on_world), "local",
                                    lambda c=on_world, f=files: json.loads(local_eval.evaluate_policy(
                                        c, f, policy=policy, adapter=Path(adapter) if adapter else None).to_json()))
            tables.append(EvalTable.from_json(table))
        return tables

    return run_task(evaluate_worlds, config, policy, adapter, options=learner_rank_options(config),
                    timeout_s=config.run.driver_timeout_s, what="the eval.worlds task", limit="run.driver_timeout_s")


def stage_table(run_dir: Path) -> str | None:
    """EM / F1 / recall of every data set and question type at each evaluated stage of this run, side by side."""
    tables = {e.column: json.loads(read_table(run_dir / f"{e.name}.json").to_json())
              for e in EVALUATIONS if (run_dir / f"{e.name}.json").is_file()}
    if len(tables) < 2:
        return None
    rows = [row["name"] for row in next(iter(tables.values()))["rows"]]
    lines = ["| data set | " + " | ".join(f"{label} EM / F1 / recall" for label in tables) + " |",
             "|---|" + "---:|" * len(tables)]
    for name in rows:
        cells = []
        for table in tables.values():
            row = next((r for r in table["rows"] if r["name"] == name), None)
            recall = "–" if row is None or row["recall"] is None else f"{row['recall']:.1f}"
            cells.append("–" if row is None else f"{row['em']:.1f} / {row['f1']:.1f} / {recall}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
