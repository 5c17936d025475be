"""``bridge-ray bench estimators``: Fig. 4a–b on the world — how close BRIDGE and Drop come to two-state.

From one policy and ``--batches`` batches of rollouts (train split from ``--first-question`` on; batch b asks the
next ``--questions`` questions and samples with seed ``run.seed + b``; a batch without a search, or whose groups'
rewards all agree, is recorded as skipped and the next questions are drawn in its place), for each batch and γ:
the cosine similarity and relative error of BRIDGE's and Drop's θ-gradients against two-state's, η trained
``--retriever-steps`` updates (:mod:`bridge_ray.probes.gradients`).

The paper's figure is a distribution over batches (unit-peak densities of the cosine, the mean relative error),
so the JSON keeps every batch's row and, per γ, the mean over batches with a 95% percentile bootstrap interval;
one batch (the default) is the same path with N = 1.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from bridge_ray.cli import add_config_arguments, add_out_argument, config_from_args
from bridge_ray.cli_types import non_negative_int, positive_float_list, positive_int
from bridge_ray.config import derive
from bridge_ray.coordinator.inputs import train_questions
from bridge_ray.errors import InputError, InputErrors
from bridge_ray.probes.batch import RolloutBatch
from bridge_ray.probes.gradients import (
    ESTIMATORS,
    INTERVAL_LEVEL,
    INTERVAL_RESAMPLES,
    MEASURES,
    ThetaGradients,
    means_per_gamma,
    measure_batch,
)
from bridge_ray.records import read_record
from bridge_ray.reporting.figures import plot_estimators, write_figures, wrote


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--gammas", type=positive_float_list, default="0.1,0.25,0.5,1,2",
                        help="comma-separated penalty coefficients")
    parser.add_argument("--questions", type=positive_int, default=4, help="train questions in each batch")
    parser.add_argument("--batches", type=positive_int, default=1,
                        help="batches to measure: draw b asks train questions F+b*Q to F+(b+1)*Q-1 (F = "
                             "--first-question, Q = --questions) "
                             "and samples with seed run.seed + b; a draw without a search or whose groups' rewards "
                             "all agree is skipped (recorded) and the next drawn; figures are per batch and their "
                             "mean over batches")
    parser.add_argument("--first-question", type=non_negative_int, default=0,
                        help="index of the first batch's first train question (skip questions known to be drawn "
                             "as unusable batches)")
    parser.add_argument("--retriever-steps", type=positive_int, default=20,
                        help="eta updates from eta_0 for each state")
    parser.add_argument("--policy", metavar="DIR_OR_NAME",
                        help="the policy (θ) to differentiate; default: the one the config trains from "
                             "(its warm-up when warmup.enabled)")
    add_out_argument(parser, "file", "figures as JSON, rewritten after each batch (a stopped run resumes from it); "
                     "a PNG of the four panels is written beside it", required=True, metavar="FILE.json",
                     resumable=True, overwrite="start over instead of continuing the run --out holds")


def run(args: argparse.Namespace) -> int:
    gammas = args.gammas
    out = Path(args.out)
    config = config_from_args(args)
    available = len(train_questions(config))
    if args.first_question + args.batches * args.questions > available:
        raise InputError(f"--first-question {args.first_question} + --batches {args.batches} × --questions "
                         f"{args.questions} needs {args.first_question + args.batches * args.questions} train "
                         f"questions; the train split has {available}")
    figures = resumed(out, args.overwrite, {
        "policy": None, "questions_per_batch": args.questions, "retriever_steps": args.retriever_steps,
        "gammas": gammas, "first_question": args.first_question, "seed": config.run.seed,
        "command": {"config": args.config and str(args.config), "policy": args.policy, "overrides": args.overrides},
        "interval": f"{INTERVAL_LEVEL:.0%} percentile bootstrap over batches ({INTERVAL_RESAMPLES} resamples)",
        "batches": [], "skipped": [], "rows": [], "summary": [],
    })
    gradients = None
    drawn = [d["batch"] for d in figures["batches"] + figures["skipped"]]
    for index in itertools.count(max(drawn, default=-1) + 1):
        if len(figures["batches"]) >= args.batches:
            break
        draw = {"batch": index, "seed": config.run.seed + index,
                "first_question": args.first_question + index * args.questions}
        if draw["first_question"] + args.questions > available:
            raise InputError(f"bench estimators: the train split ({available} questions) ran out after "
                             f"{len(figures['batches'])} of --batches {args.batches} measured batches and "
                             f"{len(figures['skipped'])} skipped ones (see 'skipped' in {out})")
        batch = RolloutBatch(derive(config, {"run.seed": draw["seed"]}, source="bench estimators' batch seed"),
                             args.questions, args.policy, first=draw["first_question"])
        figures["policy"] = batch.policy
        if reason := batch.unusable():  # recorded, and the next questions are drawn in its place
            figures["skipped"].append({**draw, "reason": reason, "reward_mean": batch.reward_mean})
            write_figures(out, figures)
            print(f"batch {index}: {reason}; skipped", flush=True)
            continue
        if gradients is None:
            gradients = ThetaGradients(batch.policy)
        rl_norm, rows = measure_batch(batch, gradients, gammas, args.retriever_steps, index)
        figures["batches"].append({
            **draw, "question_uids": [q.uid for q in batch.questions], "trajectories": len(batch.trajectories),
            "retrieval_turns": len(batch.groups), "reward_mean": batch.reward_mean, "rl_gradient_norm": rl_norm,
        })
        figures["rows"] += rows
        figures["summary"] = means_per_gamma(figures["rows"], gammas)
        write_figures(out, figures, lambda figures, png: plot_estimators(figures, png, ESTIMATORS))
        del batch
    for s in figures["summary"]:
        print(f"γ={s['gamma']:<5g} over {s['batches']} batches: " + " | ".join(
            f"{label} {measure.replace('_', ' ')} {_interval_text(s[f'{name}_{measure}'])}"
            for name, label in ESTIMATORS for measure in MEASURES), flush=True)
    wrote([out, out.with_suffix(".png")])
    return 0


class EstimatorsRun(BaseModel):
    """The figures a run wrote to ``--out``, as far as continuing it reads them (the rest is kept as it is)."""

    model_config = ConfigDict(extra="allow")

    batches: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]


# What a run's figures must share with the arguments to be continued by them.
RESUME_KEYS = ("questions_per_batch", "retriever_steps", "gammas", "first_question", "seed", "command")


def resumed(out: Path, overwrite: bool, fresh: dict[str, Any]) -> dict[str, Any]:
    """The figures ``out`` already holds from a stopped run of the same settings, which the run continues
    (a batch of the 270M takes tens of minutes on 2 cores); ``fresh`` when there is none or under ``--overwrite``."""
    if overwrite or not out.is_file():
        return fresh
    try:
        held = read_record(out, EstimatorsRun, "the figures of a bench estimators run").model_dump()
    except InputError as e:
        raise InputErrors([f"--out {problem}; choose another --out, or pass --overwrite to start over"
                           for problem in e.problems]) from None
    differing = [f"{key} {held.get(key)!r} here, {fresh[key]!r} asked" for key in RESUME_KEYS
                 if held.get(key) != fresh[key]]
    if differing:
        raise InputError(f"--out {out} holds a run with other settings ({'; '.join(differing)}); choose another "
                         "--out, or pass --overwrite to start over")
    print(f"continuing {out}: {len(held['batches'])} batches measured, {len(held['skipped'])} skipped", flush=True)
    return held


def _interval_text(figure: dict[str, float]) -> str:
    return f"{figure['mean']:.4g} [{figure['ci_low']:.4g}, {figure['ci_high']:.4g}]"


