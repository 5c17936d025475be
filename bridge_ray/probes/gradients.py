"""BRIDGE's and Drop's θ-gradient estimates against two-state's on one batch of rollouts (the paper's Fig. 4), for
each γ:

- η_γ: the query LoRA after ``steps`` updates on ``L_γ`` (the BRIDGE retriever objective) from η_0;
- η*: after as many updates on ``L_RAG`` alone (γ = ∞), the second state only the two-state estimator keeps;
- the θ-gradients of the GRPO surrogate, of ``L_RAG(θ, η_γ)`` and of ``L_RAG(θ, η*)``, the answer
  likelihoods differentiable in θ (:mod:`bridge_ray.policy_learner.rag_term`), accumulated micro-batch by micro-batch;
- the three estimators of Section 3.2 through ``algo.estimators.theta_loss`` — the gradient of its loss
  combination is the same combination of these gradients — and the cosine similarity and relative error of
  BRIDGE and Drop against two-state.

Both retriever states rank the k candidates the rollouts logged (η_0's top k), as the retriever update does. Over
batches, each figure's mean with a percentile bootstrap interval (:func:`mean_interval`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bridge_ray.algo.estimators import gradient_agreement, theta_loss
from bridge_ray.config import derive
from bridge_ray.engines.models import load_causal_lm
from bridge_ray.policy_learner.rag_term import accumulate_rag_nll_gradient
from bridge_ray.probes.batch import RolloutBatch, rl_surrogate
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever_learner.update import RetrieverUpdater

ESTIMATORS = (("bridge", "BRIDGE"), ("drop", "Drop"))
MEASURES = ("cosine", "relative_error")
INTERVAL_LEVEL, INTERVAL_RESAMPLES = 0.95, 10_000


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
