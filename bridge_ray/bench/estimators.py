"""``bridge-ray bench estimators``: Fig. 4a–b on the world — how close BRIDGE and Drop come to two-state.

From one policy and ``--batches`` batches of rollouts (train split from ``--first-question`` on; batch b asks the
next ``--questions`` questions and samples with seed ``run.seed + b``; a batch without a search, or whose groups'
rewards all agree, is recorded as skipped and the next questions are drawn in its place), and for each batch and γ:

- η_γ: the query LoRA after ``--retriever-steps`` updates on ``L_γ`` (the BRIDGE retriever objective) from η_0;
- η*: after as many updates on ``L_RAG`` alone (γ = ∞), the second state only the two-state estimator keeps;
- the θ-gradients of the GRPO surrogate, of ``L_RAG(θ, η_γ)`` and of ``L_RAG(θ, η*)``, the answer
  likelihoods differentiable in θ (:mod:`bridge_ray.policy_learner.rag_term`), accumulated micro-batch by micro-batch;
- the three estimators of Section 3.2 through ``algo.estimators.theta_loss`` — the gradient of its loss
  combination is the same combination of these gradients — and the cosine similarity and relative error of
  BRIDGE and Drop against two-state.

The paper's figure is a distribution over batches (unit-peak densities of the cosine, the mean relative error),
so the JSON keeps every batch's row and, per γ, the mean over batches with a 95% percentile bootstrap interval;
one batch (the default) is the same path with N = 1. Both retriever states rank the k candidates the rollouts
logged (η_0's top k), as the retriever update does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from bridge_ray.algo.estimators import gradient_agreement, theta_loss
from bridge_ray.atomic import write_text_atomic
from bridge_ray.bench.rollout_batch import RolloutBatch, rl_surrogate
from bridge_ray.cli import add_config_arguments, add_out_argument, config_from_args
from bridge_ray.cli_types import non_negative_int, positive_float_list, positive_int
from bridge_ray.config import derive
from bridge_ray.coordinator.inputs import train_questions
from bridge_ray.engines.models import load_causal_lm
from bridge_ray.errors import InputError, InputErrors
from bridge_ray.policy_learner.rag_term import accumulate_rag_nll_gradient
from bridge_ray.records import read_record
from bridge_ray.reporting.figures import plot_estimators
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever_learner.update import RetrieverUpdater

ESTIMATORS = (("bridge", "BRIDGE"), ("drop", "Drop"))
MEASURES = ("cosine", "relative_error")
INTERVAL_LEVEL, INTERVAL_RESAMPLES = 0.95, 10_000


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
        if reason := _unusable(batch):  # recorded, and the next questions are drawn in its place
            figures["skipped"].append({**draw, "reason": reason, "reward_mean": batch.reward_mean})
            write_text_atomic(out, json.dumps(figures, indent=2) + "\n")
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
        write_text_atomic(out, json.dumps(figures, indent=2) + "\n")
        plot_estimators(figures, out.with_suffix(".png"), ESTIMATORS)
        del batch
    for s in figures["summary"]:
        print(f"γ={s['gamma']:<5g} over {s['batches']} batches: " + " | ".join(
            f"{label} {measure.replace('_', ' ')} {_interval_text(s[f'{name}_{measure}'])}"
            for name, label in ESTIMATORS for measure in MEASURES), flush=True)
    print(f"wrote {out} and {out.with_suffix('.png')}")
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


def _unusable(batch: RolloutBatch) -> str | None:
    """Why the batch cannot compare the estimators, or None. Without a search there is no ``L_RAG`` to
    differentiate; where every group's rewards agree the advantages and so the RL gradient are 0, BRIDGE's estimate
    is 0 and its cosine 0 whatever the retriever states (the paper's batches of 512 questions never are)."""
    if not batch.groups:
        return "the rollouts made no search"
    if not bool(batch.advantages.abs().gt(0).any()):
        return "every group's rewards agree (zero advantages, zero RL gradient)"
    return None


def measure_batch(batch: RolloutBatch, gradients: ThetaGradients, gammas: list[float], steps: int,
                  index: int) -> tuple[float, list[dict]]:
    """The norm of the batch's RL gradient and one row per γ: BRIDGE's and Drop's cosine and relative error
    against two-state."""
    states = retriever_states(batch, [*gammas, math.inf], steps)
    g_rl, g_lower = gradients.rl(batch), gradients.rag(batch, states[math.inf])
    rows = []
    for gamma in gammas:
        g_penalized = gradients.rag(batch, states[gamma])
        two = theta_loss("two_state", g_rl, gamma=gamma, rag_nll_penalized=g_penalized, rag_nll_lower=g_lower)
        row = {"batch": index, "gamma": gamma, "two_state_norm": float(two.norm())}
        for name, _ in ESTIMATORS:
            estimate = theta_loss(name, g_rl, gamma=gamma, rag_nll_penalized=g_penalized)
            row[f"{name}_cosine"], row[f"{name}_relative_error"] = gradient_agreement(estimate, two)
        mask = batch.retriever_batch.candidate_mask
        row["eta_gap"] = float((states[gamma] - states[math.inf])[mask].abs().mean())
        rows.append(row)
        print(f"batch {index} γ={gamma:<5g} BRIDGE cos {row['bridge_cosine']:.4f} rel.err "
              f"{row['bridge_relative_error']:.4f} | Drop cos {row['drop_cosine']:.4f} rel.err "
              f"{row['drop_relative_error']:.4f} | mean |log ρ_γ − log ρ*| {row['eta_gap']:.4f}", flush=True)
        del g_penalized, two
    return float(g_rl.norm()), rows


def means_per_gamma(rows: list[dict], gammas: list[float]) -> list[dict]:
    """Per γ: the number of batches and, for each estimator and measure (and the η gap), the mean over batches
    with its interval."""
    keys = [f"{name}_{measure}" for name, _ in ESTIMATORS for measure in MEASURES] + ["eta_gap"]
    summary = []
    for gamma in gammas:
        of_gamma = [r for r in rows if r["gamma"] == gamma]
        summary.append({"gamma": gamma, "batches": len(of_gamma),
                        **{key: mean_interval([r[key] for r in of_gamma]) for key in keys}})
    return summary


def mean_interval(values: list[float], level: float = INTERVAL_LEVEL, resamples: int = INTERVAL_RESAMPLES,
                  seed: int = 0) -> dict[str, float]:
    """The mean of per-batch values and its percentile bootstrap interval (batches resampled with replacement).

    Percentile rather than t: the relative errors are skewed and positive, and the interval stays inside the
    values' range (on a log axis a t-interval can reach below 0). With one batch the interval is the value.
    """
    data = np.asarray(values, dtype=float)
    picks = np.random.default_rng(seed).integers(0, data.size, size=(resamples, data.size))
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(data[picks].mean(axis=1), [tail, 100 - tail])
    return {"mean": float(data.mean()), "ci_low": float(min(low, data.mean())),
            "ci_high": float(max(high, data.mean()))}


def _interval_text(figure: dict[str, float]) -> str:
    return f"{figure['mean']:.4g} [{figure['ci_low']:.4g}, {figure['ci_high']:.4g}]"


def retriever_states(batch: RolloutBatch, gammas: list[float], steps: int) -> dict[float, object]:
    """``log ρ_η(d | h_t)`` [M, K] of the logged candidates under η_γ for each γ, all trained from η_0."""
    config = batch.config
    encoder = QueryEncoder.from_config(config.retrieval)
    initial = encoder.adapter_state_dict()
    objective = config.algorithm.retriever
    states = {}
    for gamma in gammas:
        encoder.load_adapter_state_dict(initial)
        at_gamma = derive(objective, {"gamma": gamma}, source="bench estimators --gammas")
        updater = RetrieverUpdater(encoder, batch.shards.doc_embeddings, at_gamma,
                                   micro_batch_size=objective.micro_batch_size)
        for _ in range(steps):
            updater.step(batch.retriever_batch)
        states[gamma] = batch.log_rho(encoder)
    return states


class ThetaGradients:
    """Flat θ-gradients of the policy's losses on a batch (every trainable parameter of the model), the model
    loaded once for all batches.

    Each is accumulated in ``.grad`` over micro-batches (rows of the RL batch, turns of ``L_RAG``) whose
    losses sum to the whole batch's, as the learner's micro-batches do.
    """

    def __init__(self, policy: str) -> None:
        self.model = load_causal_lm(policy, dtype="float32")
        self.model.eval()  # no dropout: the gradients of one θ, not of a sampled sub-network
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def _flat_grad(self):
        flat = torch.cat([
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params
        ])
        self.model.zero_grad(set_to_none=True)
        return flat

    def rl(self, batch: RolloutBatch):
        """∇θ of the GRPO surrogate (no KL: at the reference point its gradient is 0), one trajectory per backward."""
        self.model.zero_grad(set_to_none=True)
        for row in batch.policy_rows():
            rl_surrogate(self.model, row, batch.config).backward()
        return self._flat_grad()

    def rag(self, batch: RolloutBatch, log_rho):
        """∇θ L_RAG(θ, η) on the batch for the retriever state whose log-probabilities are ``log_rho``."""
        self.model.zero_grad(set_to_none=True)
        accumulate_rag_nll_gradient(
            self.model, batch.groups, log_rho, batch.retriever_batch.candidate_mask,
            batch_size=batch.config.policy.score_batch_size, pad_token_id=batch.pad_token_id,
        )
        return self._flat_grad()
