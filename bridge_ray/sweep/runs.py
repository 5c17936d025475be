"""A sweep end to end (:func:`run_sweep`): the warm-ups, round 0, every (preset, seed) run trained and evaluated at
each checkpoint, and the results.

A staged preset (``stages:``, e.g. RAG-then-RL) runs its stages one after the other, each from the checkpoint the
one before ended on, and its curve is its stages' rounds end to end. Runs whose configs differ only in where they
write are trained once: RAG-then-RL's and RL-then-RAG's ``baseline`` stage is the fixed preset's run of the same
seed, so the three curves branch from one run, as in Fig. 2a. A run that finished is not trained again and an
unfinished one resumes from its last checkpoint, so a stopped sweep started again goes on where it was.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bridge_ray.checkpoint import LATEST, checkpoint_root
from bridge_ray.config import Config, derive
from bridge_ray.engines.precision import cpu_kernels
from bridge_ray.evaluation.cache import settings_without_folders
from bridge_ray.sweep.evaluations import Evaluator, Tables, check_kept_tables
from bridge_ray.sweep.grid import Sweep
from bridge_ray.sweep.paired import final_questions, paired_rows
from bridge_ray.sweep.results import last_rounds, point
from bridge_ray.train.run import Run
from bridge_ray.train.stages import checkpoint_start, json_gamma, stage_config
from bridge_ray.warmup import trainer as warmup


def run_sweep(sweep: Sweep) -> dict[str, Any]:
    """Train and evaluate every run of ``sweep`` (what a stopped one finished is kept), after checking every run's
    inputs and every kept evaluation; the results (:mod:`bridge_ray.sweep.results`)."""
    check_kept_tables(sweep.out, sweep.tag)
    sweep.check_runs()
    sweep.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    warm = {seed: str(warmup.warmed_up_policy(config)) for seed, config in sweep.warmup_configs().items()}
    evaluate = Evaluator(sweep.eval_sets(), sweep.split)
    start_points, curve = evaluate.round_zero(warm, sweep.out, sweep.tag, sweep.warmup_per_seed)
    rounds, plans, last_tables = [], {}, {}
    trained: dict[str, Config] = {}  # a run's config without its output folders -> the first config that ran it
    for preset, path in sweep.presets.items():
        for seed in sweep.seeds:
            config = sweep.run_config(path, seed, sweep.out / "runs" / f"{preset}-seed{seed}", warm[seed])
            plans[preset] = {"file": str(path), "stages": [
                {**stage.model_dump(), "gamma": json_gamma(stage.gamma)} for stage in config.stages]}
            lengths = [stage.rounds for stage in config.stages] or [config.run.rounds]
            print(f"== {preset} seed {seed}: {' + '.join(map(str, lengths))} rounds "
                  f"({time.time() - started:.0f} s)", flush=True)
            points, figures = run_stages(config, sweep, trained, evaluate)
            points[0] = start_points[warm[seed]]
            rounds += [{"preset": preset, "seed": seed, **r} for r in figures]
            curve += [point(preset, seed, r, name, table) for r, tables in sorted(points.items())
                      for name, table in tables.items()]
            last_tables[preset, seed] = points[max(points)]
    last = last_rounds(curve)
    sets = list(evaluate.sets)
    return {
        "command": sweep.command, "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - started),
        "warmup_policy": warm[sweep.seeds[0]] if len(set(warm.values())) == 1 else warm,
        "warmup_per_seed": sweep.warmup_per_seed, "presets": plans, "seeds": sweep.seeds, "sets": sets,
        "rounds_per_run": sweep.rounds, "eval_questions": sweep.eval_questions, "split": sweep.split,
        "baseline": sweep.baseline, "cpu_kernels": cpu_kernels(),
        "final": [p for p in curve if p["round"] == last[p["preset"]]],
        "paired": paired_rows(last_tables, sets, sweep.baseline),
        "final_questions": final_questions(last_tables, sets), "curve": curve, "rounds": rounds,
    }


def run_stages(config: Config, sweep: Sweep, trained: dict[str, Config], evaluate: Evaluator
               ) -> tuple[dict[int, Tables], list[dict[str, Any]]]:
    """Train one (preset, seed) run, a staged preset's stages end to end, each from the one before, and evaluate
    every checkpoint; its tables by round (from 1) and every round's training figures, rounds counted end to end.
    ``trained`` maps each run trained so far (:func:`run_key`) to its config: a run already trained is reused."""
    points: dict[int, Tables] = {}
    figures: list[dict[str, Any]] = []
    start, offset = None, 0
    for index in range(max(1, len(config.stages))):
        run_config = stage_config(config, index, start) if config.stages else config
        run_config = derive(run_config, {"checkpoint.keep": run_config.run.rounds // sweep.eval_every + 1},
                            source="bench learn --eval-every")  # every evaluated checkpoint
        same = trained.setdefault(run_key(run_config), run_config)
        if same is not run_config:
            print(f"   {run_config.run.output_dir}: the same run as {same.run.output_dir}", flush=True)
            run_config = same
        start = checkpoint_start(train_to_end(run_config))
        figures += [{**r, "round": r["round"] + offset}
                    for r in round_figures(Path(run_config.run.output_dir) / "phases.jsonl")]
        for checkpoint in sorted(checkpoint_root(run_config).glob("round-*")):
            ending = checkpoint_start(checkpoint)
            points[offset + int(checkpoint.name.split("-")[1])] = evaluate(
                ending.policy, Path(ending.adapter) if ending.adapter else None, checkpoint / sweep.tag)
        offset += run_config.run.rounds
    return points, figures


def run_key(config: Config) -> str:
    """``config`` without the folders it writes to: two runs with the same key train the same thing."""
    return json.dumps(settings_without_folders(config), sort_keys=True)


def train_to_end(config: Config) -> Path:
    """Run ``config``'s rounds (a :class:`Run` without ``train``'s checks and evaluations: the sweep made its own
    checks and evaluates every checkpoint) unless a previous sweep finished it, resuming an unfinished one; its
    final checkpoint."""
    checkpoints = checkpoint_root(config)
    final = checkpoints / f"round-{config.run.rounds:08d}"
    if not final.is_dir():
        with Run(config, resume=(checkpoints / LATEST).is_file()) as run:
            run.connect()
            run.start()
            run.train()
    return final


def round_figures(phases: Path) -> list[dict[str, Any]]:
    """Each round's rollout figures, from the reward phase of ``phases.jsonl`` (the last attempt of a redone round)."""
    rows = {}
    for line in phases.read_text().splitlines():
        record = json.loads(line)
        if record.get("phase") == "reward":
            info = record.get("info", {})
            rows[record["round"]] = {k: v for k, v in info.items() if isinstance(v, int | float)}
    return [{"round": r + 1, **figures} for r, figures in sorted(rows.items())]
