"""``bridge-ray bench landscape``: Fig. 3 — filter-normalised random-direction loss landscapes at two checkpoints.

Three surfaces ``f(α, β)`` per checkpoint, on :func:`bridge_ray.algo.landscape.loss_surface`'s grid:
(a) ``L_RAG(θ + α d_θ, η + β d_η)``, (b) ``L_RL(θ + α d_θ, η + β d_η)``, (c) ``L_RL(θ + α d_θ + β d_θ', η)``.

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

Each direction is one Gaussian draw from ``run.seed``, the same at both checkpoints, filter-normalised to that
checkpoint's weights. Everything runs forward only, on CPU; ``--points`` odd puts the checkpoint itself at the
centre of every grid.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from peft.tuners.lora import LoraLayer

from bridge_ray.algo.landscape import filter_normalized_direction, grid_axis, loss_surface
from bridge_ray.algo.rag import rag_nll
from bridge_ray.algo.retrieval_rl import retrieval_credit, retrieval_rl_loss
from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.atomic import write_text_atomic
from bridge_ray.bench.rollout_batch import RolloutBatch, rl_surrogate
from bridge_ray.checkpoint import POLICY_DIR, checkpoint_root, find_checkpoint, retriever_adapter_dir
from bridge_ray.cli import add_config_arguments, add_out_argument, config_from_args
from bridge_ray.cli_types import non_negative_int, positive_float, positive_int
from bridge_ray.engines.models import load_causal_lm
from bridge_ray.errors import InputError
from bridge_ray.policy_learner.batch import PolicyBatch
from bridge_ray.policy_learner.objective import sequence_log_probs, with_learner_old_logp
from bridge_ray.policy_learner.rag_term import answer_log_likelihoods
from bridge_ray.reporting.figures import plot_landscape
from bridge_ray.retrieval.encoder import QueryEncoder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--initial", metavar="CHECKPOINT",
                        help="initial checkpoint (its policy/ and retriever_adapter/); default: the policy the config "
                             "trains from (its warm-up when warmup.enabled) with the base retriever")
    parser.add_argument("--final", metavar="CHECKPOINT",
                        help="final checkpoint, or a directory of checkpoints (its latest); default: the latest "
                             "under the config's checkpoint root")
    parser.add_argument("--questions", type=positive_int, default=1, help="train questions in the batch")
    parser.add_argument("--first-question", type=non_negative_int, default=0,
                        help="index of the batch's first train question (a group whose rewards all agree has zero "
                             "advantages, hence a zero RL loss everywhere)")
    parser.add_argument("--points", type=positive_int, default=7,
                        help="grid points per axis (odd: the checkpoint is the centre)")
    parser.add_argument("--span", type=positive_float, default=1.0,
                        help="the grid covers [-span, span] along each direction (1: a step of each filter's norm)")
    add_out_argument(parser, "file", "grids and axes as JSON; a PNG of the contour plots is written beside it",
                     required=True, metavar="FILE.json")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    config = config_from_args(args)
    try:
        axis = grid_axis(args.span, args.points)
    except ValueError as exc:
        raise InputError(f"--points {args.points} / --span {args.span}: {exc}") from None
    if args.questions < 1 or args.first_question < 0:
        raise InputError(f"--questions {args.questions} / --first-question {args.first_question}: must be >= 1 / >= 0")
    if config.roles.torch_threads:
        torch.set_num_threads(config.roles.torch_threads)
    initial = _checkpoint(args.initial, "--initial") if args.initial else (None, None)
    final = _checkpoint(args.final or checkpoint_root(config), "--final")
    started = time.time()
    batch = RolloutBatch(config, args.questions, str(initial[0]) if initial[0] else None, initial[1],
                         first=args.first_question)
    if not batch.groups:
        raise InputError("bench landscape: the batch's rollouts made no search; no L_RAG to draw "
                         "(use a policy that searches: its warm-up, or the few-shot prompt)")
    if not bool(batch.advantages.abs().gt(0).any()):
        raise InputError(f"bench landscape: every group of the batch (train questions {args.first_question} to "
                         f"{args.first_question + args.questions - 1}) has rewards that all agree, so every "
                         "advantage and the RL loss are 0 everywhere; pick other questions with --first-question "
                         "or more with --questions")
    print(f"batch: {len(batch.trajectories)} trajectories, {len(batch.groups)} retrieval turns, mean reward "
          f"{batch.reward_mean:.3f} ({time.time() - started:.0f} s)", flush=True)
    objectives = None
    checkpoints = {}
    for label, (policy, adapter) in (("initial", (batch.policy, initial[1])), ("final", final)):
        model = _load_policy(str(policy))
        objectives = objectives or Objectives(batch, model)  # ratios against the batch's own (initial) policy
        checkpoints[label] = {"policy": str(policy), "retriever_adapter": str(adapter) if adapter else None,
                              **surfaces(objectives, model, _load_encoder(config, adapter), axis, label)}
        del model
    figures = {
        "axis": axis, "span": args.span, "points": args.points, "seed": config.run.seed,
        "batch": {"policy": batch.policy, "questions": len(batch.questions), "trajectories": len(batch.trajectories),
                  "retrieval_turns": len(batch.groups), "reward_mean": batch.reward_mean},
        "grids": "values[i][j] at alpha = axis[i] (theta direction d), beta = axis[j] (eta direction, or theta "
                 "direction d' for rl_theta)",
        "checkpoints": checkpoints, "seconds": round(time.time() - started, 1),
    }
    write_text_atomic(out, json.dumps(figures, indent=2) + "\n")
    png = out.with_suffix(".png")
    plot_landscape(figures, png)
    print(f"wrote {out} and {png}")
    return 0


def _checkpoint(path: str | Path, flag: str) -> tuple[Path, Path | None]:
    """The policy directory and retriever adapter (None: the run's retriever was fixed) of a checkpoint."""
    directory, _ = find_checkpoint(path, flag, model=POLICY_DIR)
    return directory / POLICY_DIR, retriever_adapter_dir(directory)


def _load_policy(policy: str) -> torch.nn.Module:
    return load_causal_lm(policy, dtype="float32").requires_grad_(False)


def _load_encoder(config, adapter: Path | None) -> QueryEncoder:
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
