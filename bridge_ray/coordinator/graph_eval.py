"""Greedy evaluation on the graph's samplers (``local_eval`` is the same without Ray), the run's learning curve
(``eval.jsonl``) and a table's figures as a round logs them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bridge_ray.data.qa import QuestionRecord
from bridge_ray.evaluation.table import EvalTable, summarize
from bridge_ray.progress import Progress, pieces_per_worker
from bridge_ray.sampler.handle import SamplerGroup


def evaluate_on_samplers(samplers: SamplerGroup, eval_sets: dict[str, list[QuestionRecord]]) -> EvalTable:
    """Greedy rollouts of what the samplers serve on every eval set, spread over them.

    Each set is cut into pieces (about a tenth of it each when it is large, :func:`pieces_per_worker`), whose
    progress is reported as they finish.
    """
    per_dataset = {}
    for name, questions in eval_sets.items():
        pieces = pieces_per_worker(len(questions), len(samplers))
        calls = samplers.evaluate(questions, pieces_per_actor=pieces)
        per_dataset[name] = []
        with Progress(len(questions), f"evaluation on {name}", "questions") as progress:
            for call in calls:  # in order: a line (or a bar's step) per finished piece
                [part] = samplers.collect([call], f"evaluation on {name}").values
                per_dataset[name] += part
                progress.update(len(part))
    return summarize(per_dataset)


def append_eval_record(run_dir: Path, table: EvalTable, **measured: Any) -> None:
    """Append ``table`` to ``eval.jsonl`` with what it ``measured`` (label, round, versions), as one JSON line in
    one write to a file opened for appending (readers may tail it)."""
    record = {**measured, "time": time.time(), "table": json.loads(table.to_json())}
    with (run_dir / "eval.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")


def eval_figures(table: EvalTable) -> dict[str, float]:
    """EM (and recall) of each set and their average, as a round's ``eval/`` figures."""
    figures = {f"{row.name}/em": row.em for row in table.rows}
    figures |= {f"{row.name}/recall": row.recall for row in table.rows if row.recall is not None}
    if table.avg is not None:
        figures["avg"] = table.avg
    return figures
