"""Schedules of runs: the ``stages:`` config section (paper Table 3 and Fig. 2a).

A schedule is a list of stages, each its own run under ``<run.output_dir>/stages/<name>/`` with a fresh round
counter and fresh optimizer states. A stage starts from the final policy and query adapter of the stage before
it (the config's own starting point for the first: ``policy.model``, the warm-up, ``retrieval.encoder.adapter``)
or from a given checkpoint, and sets what trains (``algorithm.train_policy`` / ``train_retriever``) and its γ.
It continues that checkpoint's question order (``run.continue_from``): its data cursor and RNG state, so a stage
draws the questions and sampler seeds that follow its start's rather than replaying them from ``run.seed``.
RAG-then-RL, for instance, is a fixed-retriever RL stage, a retriever-only stage at γ = inf, then a policy-only
stage. Each finished stage is recorded in ``<run.output_dir>/stages.json``, so a re-run skips it.

This module derives each stage's config and keeps the record; :mod:`bridge_ray.train.job` runs the stages.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bridge_ray.atomic import write_text_atomic
from bridge_ray.checkpoint import POLICY_DIR, retriever_adapter_dir
from bridge_ray.config import Config, StageConfig, derive
from bridge_ray.errors import InputError

STAGES_DIR, STAGES_FILE = "stages", "stages.json"


@dataclass(frozen=True)
class StartPoint:
    """The policy weights (an HF directory) and the query adapter (a peft directory; None: a fresh one) a stage
    starts from, and the checkpoint that ends with them, whose question order it continues."""

    policy: str
    adapter: str | None
    checkpoint: str


def checkpoint_start(checkpoint: str | Path) -> StartPoint:
    """What a checkpoint's run ended with: its policy and the adapter it retrieves with."""
    checkpoint = Path(checkpoint)
    adapter = retriever_adapter_dir(checkpoint)
    return StartPoint(str(checkpoint / POLICY_DIR), str(adapter) if adapter else None, str(checkpoint))


def stage_outputs(config: Config, stage: StageConfig) -> Config:
    """``config`` writing where ``stage`` writes: ``<run.output_dir>/stages/<name>`` (its checkpoints under
    ``<checkpoint.dir>/stages/<name>`` when ``checkpoint.dir`` is set)."""
    return derive(config, _output_changes(config, stage), source=f"stage {stage.name}")


def _output_changes(config: Config, stage: StageConfig) -> dict[str, Any]:
    checkpoint_dir = config.checkpoint.dir and str(Path(config.checkpoint.dir) / STAGES_DIR / stage.name)
    return {"run.output_dir": str(Path(config.run.output_dir) / STAGES_DIR / stage.name),
            "checkpoint.dir": checkpoint_dir}


def stage_config(config: Config, index: int, start: StartPoint | None) -> Config:
    """The config of stage ``index``'s run, starting from ``start`` (None: the config's own starting point).

    Only the first stage evaluates before training (a later stage starts where the one before it ended); the
    warm-up runs only when the config's own policy is the start. A stage with a start continues its question
    order (``run.continue_from``).
    """
    stage = config.stages[index]
    changes = _output_changes(config, stage) | {
        "stages": [],
        "algorithm": stage.algorithm(config.algorithm).model_dump(),
        "run.rounds": stage.rounds,
        "eval.before_training": config.eval.before_training and index == 0,
    }
    if start is not None:
        changes |= {"policy.model": start.policy, "retrieval.encoder.adapter": start.adapter,
                    "run.continue_from": start.checkpoint, "warmup.enabled": False}
    return derive(config, changes, source=f"stage {stage.name}")


def json_gamma(gamma: float | None) -> float | str | None:
    """γ as JSON can hold it (``"inf"``)."""
    return "inf" if gamma is not None and math.isinf(gamma) else gamma


@dataclass
class StageRecord:
    """A finished stage, as ``stages.json`` lists it."""

    name: str
    train: str
    gamma: float | str | None  # the stage's own γ (null: the config's; "inf": RAG only)
    rounds: int
    start: str
    checkpoint: str  # the stage's final checkpoint
    policy: str  # what the next stage starts from
    adapter: str | None
    eval: dict[str, Any] | None  # the stage's eval_after table, when evaluated

    @classmethod
    def of(cls, stage: StageConfig, checkpoint: Path, eval_table: dict[str, Any] | None) -> StageRecord:
        end = checkpoint_start(checkpoint)
        return cls(stage.name, stage.train, json_gamma(stage.gamma), stage.rounds, stage.start, str(checkpoint),
                   end.policy, end.adapter, eval_table)

    def definition(self) -> dict[str, Any]:
        return {"train": self.train, "gamma": self.gamma, "rounds": self.rounds, "start": self.start}


class StageLog:
    """``<run.output_dir>/stages.json``: the finished stages in schedule order, rewritten atomically after each."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / STAGES_FILE
        self.records: dict[str, StageRecord] = {}
        if self.path.is_file():
            try:
                self.records = {r["name"]: StageRecord(**r) for r in json.loads(self.path.read_text())["stages"]}
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise InputError(f"{self.path}: not a stages record ({exc}); pass --overwrite to start over") from None

    def finished(self, stage: StageConfig) -> StageRecord | None:
        """The record of ``stage`` if it finished as the config defines it now; an error if it finished otherwise
        or its final checkpoint is gone."""
        record = self.records.get(stage.name)
        if record is None:
            return None
        now = {"train": stage.train, "gamma": json_gamma(stage.gamma), "rounds": stage.rounds, "start": stage.start}
        if record.definition() != now:
            raise InputError(
                f"stage {stage.name!r} finished as {record.definition()} ({self.path}), the config now says {now}; "
                "pass --overwrite to run the schedule again"
            )
        if not (Path(record.checkpoint) / POLICY_DIR).is_dir():
            raise InputError(f"stage {stage.name!r}: its final checkpoint {record.checkpoint} is gone; pass "
                             "--overwrite to run the schedule again")
        return record

    def add(self, record: StageRecord, order: list[str]) -> None:
        """Record a finished stage; the file lists the stages in the schedule's ``order``."""
        self.records[record.name] = record
        records = [asdict(self.records[name]) for name in order if name in self.records]
        write_text_atomic(self.path, json.dumps({"stages": records}, indent=1) + "\n")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.records = {}
