"""The evaluations a sweep keeps: every held-out set's table of a policy, written beside its checkpoint (or, for a
warm-up, in the sweep's folder) so that a stopped sweep resumes without evaluating again.

Round 0 is the warm-up policy with the base retriever, the same for every run of a warm-up, so it is evaluated once
per warm-up, and kept in the cache root for later sweeps asking the same (:mod:`bridge_ray.evaluation.cache`); so is
the ``oracle`` arm, the warm-up policy shown the gold passages at every search (``eval.oracle_retrieval``): the EM a
perfect retriever would buy without training the policy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import RootModel

from bridge_ray.atomic import write_text_atomic
from bridge_ray.config import Config, derive
from bridge_ray.coordinator.inputs import configured_world, index_dir
from bridge_ray.errors import InputError, InputErrors
from bridge_ray.evaluation.cache import cached_table
from bridge_ray.evaluation.table import EvalTable, TableRecord
from bridge_ray.records import read_record
from bridge_ray.sweep.results import ORACLE, point
from bridge_ray.train import local_eval

KEPT_TABLES = "an evaluation bench learn kept (a JSON object: set -> evaluation table)"
Tables = dict[str, dict[str, Any]]  # set -> its evaluation table, as JSON


class KeptTables(RootModel[dict[str, TableRecord]]):
    """An evaluation a sweep keeps (``*-<tag>`` in its folder, ``<tag>`` beside a checkpoint): each set's table."""


def kept_tables(path: Path) -> Tables:
    """Each set's table kept at ``path``, read through the evaluation file's schema."""
    return {name: json.loads(EvalTable.from_record(table).to_json())
            for name, table in read_record(path, KeptTables, KEPT_TABLES).root.items()}


def check_kept_tables(out: Path, tag: str) -> None:
    """Every evaluation a stopped sweep kept in ``out`` and this one would reuse, read before the warm-up trains: a
    damaged or hand-made one is an error naming the file and the field."""
    found: list[str] = []
    for path in sorted(out.rglob(f"*{tag}")) if out.is_dir() else []:
        try:
            kept_tables(path)
        except InputError as e:
            found += [f"{problem}; remove it to evaluate again" for problem in e.problems]
    if found:
        raise InputErrors(found)


class Evaluator:
    """Greedy evaluations of policies on the sweep's held-out sets (``sets``: name -> its config), each asking the
    ``split`` of its world."""

    def __init__(self, sets: dict[str, Config], split: str) -> None:
        self.sets, self.split = sets, split

    def __call__(self, policy: str, adapter: Path | None, cache: Path, oracle: bool = False) -> Tables:
        """Every set's table, kept in ``cache`` so that a sweep that stopped resumes where it was, and a cached
        policy's (the warm-up's) in the cache root too, for every sweep after (:mod:`bridge_ray.evaluation.cache`)."""
        if cache.is_file():
            return kept_tables(cache)
        tables = {}
        for name, config in self.sets.items():
            if oracle:
                config = derive(config, {"eval.oracle_retrieval": True}, source="bench learn's oracle evaluation")
            held_out = {name: str(configured_world(config) / f"{self.split}.jsonl")}
            tables[name], _ = cached_table(
                config, held_out, policy, adapter, index_dir(config), "local",
                lambda c=config, h=held_out: json.loads(
                    local_eval.evaluate_policy(c, h, policy=policy, adapter=adapter).to_json()))
        write_text_atomic(cache, json.dumps(tables))
        return tables

    def round_zero(self, warm: dict[int, str], out: Path, tag: str, per_seed: bool
                   ) -> tuple[dict[str, Tables], list[dict[str, Any]]]:
        """Each warm-up policy's tables (``warm``: seed -> policy; seeds that share one evaluate it once), and the
        oracle arm's curve points (a shared warm-up's belong to no seed: ``per_seed`` false)."""
        start_points: dict[str, Tables] = {}
        oracle_points: list[dict[str, Any]] = []
        for seed, policy in warm.items():
            if policy in start_points:  # the seeds share it
                continue
            print(f"round 0: evaluating the warm-up policy {policy}, with the frozen retriever and with the oracle",
                  flush=True)
            start_points[policy] = self(policy, None, out / f"{Path(policy).name}-{tag}")
            oracle = self(policy, None, out / f"{Path(policy).name}-oracle-{tag}", oracle=True)
            oracle_points += [point(ORACLE, seed if per_seed else None, 0, name, table)
                              for name, table in oracle.items()]
        return start_points, oracle_points
