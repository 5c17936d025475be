"""``bridge-ray bench estimators``: Fig. 4a–b on the world — how close BRIDGE and Drop come to two-state.

From one policy and one batch of rollouts (train split), and for each γ:

- η_γ: the query LoRA after ``--retriever-steps`` updates on ``L_γ`` (the BRIDGE retriever objective) from η_0;
- η*: after as many updates on ``L_RAG`` alone (γ = ∞), the second state only the two-state estimator keeps;
- the θ-gradients of the GRPO surrogate, of ``L_RAG(θ, η_γ)`` and of ``L_RAG(θ, η*)``, the answer
  likelihoods differentiable in θ (:mod:`bridge_ray.policy.rag_term`), accumulated micro-batch by micro-batch;
- the three estimators of Section 3.2 through ``algo.estimators.theta_loss`` — the gradient of its loss
  combination is the same combination of these gradients — and the cosine similarity and relative error of
  BRIDGE and Drop against two-state.

Both retriever states rank the k candidates the rollouts logged (η_0's top k), as the retriever update does.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bridge_ray.commands._bench_batch import RolloutBatch, rl_surrogate

HELP = "Fig. 4a-b: cosine and relative error of the BRIDGE and Drop theta-gradients against two-state, over gamma"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bridge_ray.cli import add_config_arguments

    add_config_arguments(parser)
    parser.add_argument("--gammas", default="0.1,0.25,0.5,1,2", help="comma-separated penalty coefficients")
    parser.add_argument("--questions", type=int, default=4, help="train questions in the batch")
    parser.add_argument("--retriever-steps", type=int, default=20, help="eta updates from eta_0 for each state")
    parser.add_argument("--policy", metavar="DIR_OR_NAME",
                        help="the policy (θ) to differentiate; default: the one the config trains from "
                             "(its warm-up when warmup.enabled)")
    parser.add_argument("--out", required=True, metavar="FILE.json",
                        help="figures as JSON; a PNG of the two panels is written beside it")


def run(args: argparse.Namespace) -> int:
    from bridge_ray.algo.estimators import gradient_agreement, theta_loss
    from bridge_ray.atomic import write_text_atomic
    from bridge_ray.cli import config_from_args
    from bridge_ray.errors import InputError

    gammas = _gammas(args.gammas)
    out = Path(args.out)
    config = config_from_args(args)
    batch = RolloutBatch(config, args.questions, args.policy)
    if not batch.groups:
        raise InputError("bench estimators: the batch's rollouts made no search; no L_RAG to differentiate "
                         "(use a policy that searches: its warm-up, or the few-shot prompt)")
    states = retriever_states(config, batch, [*gammas, math.inf], args.retriever_steps)
    gradients = ThetaGradients(config, batch)
    g_rl, g_lower = gradients.rl(), gradients.rag(states[math.inf])
    rows = []
    for gamma in gammas:
        g_penalized = gradients.rag(states[gamma])
        two = theta_loss("two_state", g_rl, gamma=gamma, rag_nll_penalized=g_penalized, rag_nll_lower=g_lower)
        row = {"gamma": gamma, "two_state_norm": float(two.norm())}
        for name in ("bridge", "drop"):
            estimate = theta_loss(name, g_rl, gamma=gamma, rag_nll_penalized=g_penalized)
            row[f"{name}_cosine"], row[f"{name}_relative_error"] = gradient_agreement(estimate, two)
        mask = batch.retriever_batch.candidate_mask
        row["eta_gap"] = float((states[gamma] - states[math.inf])[mask].abs().mean())
        rows.append(row)
        print(f"γ={gamma:<5g} BRIDGE cos {row['bridge_cosine']:.4f} rel.err {row['bridge_relative_error']:.4f} | "
              f"Drop cos {row['drop_cosine']:.4f} rel.err {row['drop_relative_error']:.4f} | "
              f"mean |log ρ_γ − log ρ*| {row['eta_gap']:.4f}", flush=True)
        del g_penalized, two
    figures = {
        "policy": batch.policy, "questions": len(batch.questions), "trajectories": len(batch.trajectories),
        "retrieval_turns": len(batch.groups), "reward_mean": batch.reward_mean,
        "rl_gradient_norm": float(g_rl.norm()), "retriever_steps": args.retriever_steps, "rows": rows,
    }
    write_text_atomic(out, json.dumps(figures, indent=2) + "\n")
    png = out.with_suffix(".png")
    plot(rows, png)
    print(f"wrote {out} and {png}")
    return 0


def _gammas(text: str) -> list[float]:
    from bridge_ray.errors import InputError

    try:
        gammas = [float(g) for g in text.split(",") if g.strip()]
    except ValueError as exc:
        raise InputError(f"--gammas {text!r}: {exc}") from None
    if not gammas or any(not 0 < g < math.inf for g in gammas):
        raise InputError(f"--gammas {text!r}: each must be a finite number > 0 (two-state needs 0 < γ < ∞)")
    return gammas


def retriever_states(config, batch: RolloutBatch, gammas: list[float], steps: int) -> dict[float, object]:
    """``log ρ_η(d | h_t)`` [M, K] of the logged candidates under η_γ for each γ, all trained from η_0."""
    from bridge_ray.retrieval.encoder import QueryEncoder
    from bridge_ray.retriever.update import RetrieverUpdater

    encoder = QueryEncoder.from_config(config.retrieval)
    initial = encoder.adapter_state_dict()
    objective = config.algorithm.retriever
    states = {}
    for gamma in gammas:
        encoder.load_adapter_state_dict(initial)
        updater = RetrieverUpdater(encoder, batch.shards.doc_embeddings, objective.model_copy(update={"gamma": gamma}),
                                   micro_batch_size=objective.micro_batch_size)
        for _ in range(steps):
            updater.step(batch.retriever_batch)
        states[gamma] = batch.log_rho(encoder)
    return states


class ThetaGradients:
    """Flat θ-gradients of the policy's losses on one batch (every trainable parameter of the model).

    Each is accumulated in ``.grad`` over micro-batches (rows of the RL batch, turns of ``L_RAG``) whose
    losses sum to the whole batch's, as the learner's micro-batches do.
    """

    def __init__(self, config, batch: RolloutBatch) -> None:
        from bridge_ray.engines.models import load_causal_lm

        self.config, self.batch = config, batch
        self.model = load_causal_lm(batch.policy, dtype="float32")
        self.model.eval()  # no dropout: the gradients of one θ, not of a sampled sub-network
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def _flat_grad(self):
        import torch

        flat = torch.cat([
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params
        ])
        self.model.zero_grad(set_to_none=True)
        return flat

    def rl(self):
        """∇θ of the GRPO surrogate (no KL: at the reference point its gradient is 0), one trajectory per backward."""
        self.model.zero_grad(set_to_none=True)
        for row in self.batch.policy_rows():
            rl_surrogate(self.model, row, self.config).backward()
        return self._flat_grad()

    def rag(self, log_rho):
        """∇θ L_RAG(θ, η) for the retriever state whose log-probabilities are ``log_rho``."""
        from bridge_ray.policy.rag_term import accumulate_rag_nll_gradient

        self.model.zero_grad(set_to_none=True)
        accumulate_rag_nll_gradient(
            self.model, self.batch.groups, log_rho, self.batch.retriever_batch.candidate_mask,
            batch_size=self.config.policy.score_batch_size, pad_token_id=self.batch.pad_token_id,
        )
        return self._flat_grad()


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bridge_ray.atomic import replacing

    gammas = [r["gamma"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    # Relative errors span decades (BRIDGE's ~0.1 against Drop's up to ~100): a log axis keeps both visible.
    for ax, measure, title, ylabel in (
            (axes[0], "cosine", "cosine similarity to two-state", "cosine"),
            (axes[1], "relative_error", "relative error to two-state", "‖g − g_two-state‖ / ‖g_two-state‖")):
        for name, label in (("bridge", "BRIDGE"), ("drop", "Drop")):
            ax.plot(gammas, [r[f"{name}_{measure}"] for r in rows], marker="o", label=label)
        ax.set_xscale("log")
        if measure == "relative_error":
            ax.set_yscale("log")
        ax.set_xlabel("γ")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
