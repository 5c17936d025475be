"""Filter-normalised random-direction loss landscapes (the paper's Fig. 3) on one fixed batch of rollouts:
``L_RAG`` and ``L_RL`` as functions of a policy model and a query encoder (:class:`Objectives`), and their surfaces
along directions in θ and η at one checkpoint (:func:`surfaces`).

The objectives, on one fixed batch of rollouts drawn by the initial policy and retriever (the same batch at
both checkpoints, so the panels compare; the rollouts are never redrawn):

- ``L_RAG`` (eq. lrag) over the batch's retrieval turns and the candidates they logged;
- ``L_RL``: the two RL losses BRIDGE descends — the GRPO surrogate of the policy's tokens (no KL) plus the
  retriever's outcome-credit surrogate (eq. app_retrieval_rl_loss), its credit from the answer likelihoods under
  the θ evaluated (as the samplers' scorer computes it with the current policy). Both ratios are taken against
  the batch's own policy and retriever (the learner's log-probs when ``algorithm.grpo.old_logp`` is ``learner``),
  so both checkpoints lie on one function. On a fixed batch η reaches ``L_RL`` only through the retrieval turns.

What the directions perturb, and why:

- θ: the matrices a policy LoRA adapts (``learner.lora.target_modules``: the attention and MLP projections of
  every decoder layer), in full. It is where both training modes move (a LoRA's updates lie in these matrices),
  it leaves out the tied 262k-row embedding (two thirds of the 270M's weights, whose direction would dominate
  the draw) and the norm scales (1-D: zero in Li et al.), and two directions plus a copy fit in a few GB on CPU.
  The LoRA factors themselves cannot carry a filter-normalised direction (below).
- η: the query encoder's LoRA-adapted matrices (``retrieval.lora.target_modules``), in their effective weights
  ``W + BA``. A direction on the factors is degenerate at the base retriever: B = 0 there (peft's init), so
  every B filter has norm 0 and a direction on A alone changes nothing.

Each direction is one Gaussian draw from ``run.seed``, the same at every checkpoint, filter-normalised to that
checkpoint's weights.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from peft.tuners.lora import LoraLayer

from bridge_ray.algo.landscape import filter_normalized_direction, loss_surface
from bridge_ray.algo.rag import rag_nll
from bridge_ray.algo.retrieval_rl import retrieval_credit, retrieval_rl_loss
from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.engines.models import load_causal_lm
from bridge_ray.errors import InputError
from bridge_ray.policy_learner.batch import PolicyBatch
from bridge_ray.policy_learner.objective import sequence_log_probs, with_learner_old_logp
from bridge_ray.policy_learner.rag_term import answer_log_likelihoods
from bridge_ray.probes.batch import RolloutBatch, rl_surrogate
from bridge_ray.retrieval.encoder import QueryEncoder


def load_policy(policy: str) -> torch.nn.Module:
    return load_causal_lm(policy, dtype="float32").requires_grad_(False)


def load_encoder(config, adapter: Path | None) -> QueryEncoder:
    encoder = QueryEncoder.from_config(config.retrieval, adapter)
    encoder.requires_grad_(False)
    return encoder


class Objectives:
    """``L_RAG`` and ``L_RL`` on one batch, as functions of a policy model and a query encoder (forward only)."""

    def __init__(self, batch: RolloutBatch, reference: torch.nn.Module) -> None:
        self.batch, self.config = batch, batch.config
        grpo = self.config.algorithm.grpo
        rows = batch.policy_rows()
        if grpo.old_logp == "learner":  # as the learner does: the ratio's reference is its own log-probs
            with torch.no_grad():
                rows = [with_learner_old_logp(row, sequence_log_probs(
                    reference, row, temperature=self.config.rollout.temperature)[0], grpo)[0] for row in rows]
        self.rows: list[PolicyBatch] = rows
        update = batch.retriever_batch
        self.mask = update.candidate_mask
        objective = self.config.algorithm.retriever
        self.old_log_rho = retrieval_log_probs(update.old_scores, objective.retrieval_temperature, self.mask)
        # the credit the retriever update gives this batch: from the scorer's likelihoods at rollout time
        self.credit = retrieval_credit(self.old_log_rho, update.answer_logp, objective.posterior_temperature, self.mask)

    def policy_loss(self, model: torch.nn.Module) -> float:
        """The GRPO surrogate loss of the batch's policy tokens."""
        with torch.no_grad():
            return sum(float(rl_surrogate(model, row, self.config)) for row in self.rows)

    def answer_logp(self, model: torch.nn.Module) -> torch.Tensor:
        """``log p_θ(y | h_t, d)`` [M, K] of every logged candidate."""
        with torch.no_grad():
            return answer_log_likelihoods(model, self.batch.groups, self.config.policy.score_batch_size,
                                          self.batch.pad_token_id, k=self.mask.shape[-1])

    def rag(self, log_rho: torch.Tensor, answer_logp: torch.Tensor) -> float:
        """``L_RAG(θ, η)`` (eq. lrag)."""
        return float(rag_nll(log_rho, answer_logp, self.mask))

    def retrieval_loss(self, log_rho: torch.Tensor) -> float:
        """The retriever's outcome-credit surrogate loss (eq. app_retrieval_rl_loss) with the batch's credit."""
        update = self.batch.retriever_batch
        return float(retrieval_rl_loss(log_rho, self.old_log_rho, self.credit, update.advantages,
                                       self.config.algorithm.retriever.clip_eps, self.mask)[0])


def policy_matrices(model: torch.nn.Module, targets: list[str]) -> list[torch.Tensor]:
    """The weights of the modules a policy LoRA adapts (names ending in one of ``targets``)."""
    found = [m.weight for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in targets
             and getattr(m, "weight", None) is not None and m.weight.dim() == 2]
    if not found:
        raise InputError(f"learner.lora.target_modules {targets}: no matrix of the policy matches")
    return found


def encoder_matrices(encoder: QueryEncoder) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The base weights of the query encoder's LoRA layers, and their effective weights ``W + BA`` (the filters'
    norms): perturbing the base weight perturbs the effective one by the same amount."""
    bases, effective = [], []
    for module in encoder.model.modules():
        if isinstance(module, LoraLayer):
            base = module.get_base_layer().weight
            with torch.no_grad():
                delta = sum(module.get_delta_weight(name) for name in module.active_adapters)
            bases.append(base)
            effective.append(base.detach() + delta)
    return bases, effective


def surfaces(objectives: Objectives, model: torch.nn.Module, encoder: QueryEncoder, axis: list[float],
             label: str) -> dict:
    """The three surfaces at one checkpoint, their centres, minima and ranges along the centre lines."""
    config = objectives.config
    theta = policy_matrices(model, config.learner.lora.target_modules)
    theta_draw = torch.Generator().manual_seed(config.run.seed)
    d_theta = filter_normalized_direction(theta, theta_draw)
    d_theta2 = filter_normalized_direction(theta, theta_draw)
    eta, eta_filters = encoder_matrices(encoder)
    d_eta = filter_normalized_direction(eta_filters, torch.Generator().manual_seed(config.run.seed + 1))

    theta_side: dict[int, tuple[float, torch.Tensor]] = {}
    eta_side: dict[int, torch.Tensor] = {}

    def joint(i: int, j: int) -> dict[str, float]:
        if i not in theta_side:  # θ moves along the rows only: one policy evaluation per α
            theta_side.clear()
            theta_side[i] = (objectives.policy_loss(model), objectives.answer_logp(model))
        if j not in eta_side:  # η along the columns: one query encoding per β
            eta_side[j] = objectives.batch.log_rho(encoder)
        policy, answer_logp = theta_side[i]
        values = {"rag_joint": objectives.rag(eta_side[j], answer_logp),
                  "rl_joint": policy + objectives.retrieval_loss(eta_side[j])}
        _progress(label, "θ×η", i, j, len(axis), values, started)
        return values

    retrieval_here = objectives.retrieval_loss(objectives.batch.log_rho(encoder))

    def theta_only(i: int, j: int) -> dict[str, float]:
        values = {"rl_theta": objectives.policy_loss(model) + retrieval_here}
        _progress(label, "θ×θ'", i, j, len(axis), values, started)
        return values

    started = time.time()
    grids = loss_surface([*theta, *eta], [*d_theta, *[None] * len(eta)], [*[None] * len(theta), *d_eta],
                         axis, axis, joint)
    grids |= loss_surface(theta, d_theta, d_theta2, axis, axis, theta_only)
    summary = {"theta_parameters": sum(p.numel() for p in theta), "eta_parameters": sum(p.numel() for p in eta)}
    return summary | {name: _summary(grid, axis) for name, grid in grids.items()}


def _progress(label: str, plane: str, i: int, j: int, n: int, values: dict[str, float], started: float) -> None:
    shown = " ".join(f"{name} {value:.4f}" for name, value in values.items())
    print(f"{label} {plane} [{i * n + j + 1}/{n * n}] {shown} ({time.time() - started:.0f} s)", flush=True)


def _summary(grid: torch.Tensor, axis: list[float]) -> dict:
    """The grid, its centre (the checkpoint), its minimum and where, and its ranges along the two centre lines."""
    c = len(axis) // 2
    i, j = divmod(int(grid.argmin()), grid.shape[1])
    return {"values": grid.tolist(), "centre": float(grid[c, c]), "min": float(grid[i, j]),
            "argmin": [axis[i], axis[j]], "range_alpha": float(grid[:, c].max() - grid[:, c].min()),
            "range_beta": float(grid[c, :].max() - grid[c, :].min())}
