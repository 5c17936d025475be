"""The policy learner: N Ray actors, one DeepSpeed ZeRO rank each, in one torch.distributed group.

:class:`~bridge_ray.policy_learner.handle.PolicyLearnerGroup` is what the coordinator owns: an ``ActorGroup`` of
ranks (one bundle each, sorted by node, never restarted) whose rank 0 chooses the rendezvous. A round's rows reach
every rank by reference (:class:`PolicyRows`: the samplers' trajectory refs, the rows kept and their advantages);
each rank builds the :class:`PolicyBatch` itself and cuts the same plan from it — epochs × mini-batches (whole
questions) × micro-batches — keeping its own shard. Each mini-batch is one optimizer step whose gradient equals the
single-process gradient of the whole mini-batch (see :mod:`bridge_ray.policy_learner.batch` for the normalisation).
With the Drop and two-state estimators every step also adds their ``γ ∇θ L_RAG`` terms (:class:`RagTerms`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import ray
import torch

from bridge_ray.agent.types import RetrievalRows
from bridge_ray.checkpoint import POLICY_ADAPTER_DIR, POLICY_DIR, POLICY_STATE_DIR, POLICY_STATE_TAG
from bridge_ray.config import Config
from bridge_ray.engines.base import PolicyWeights, PrefixGroup
from bridge_ray.engines.models import config_pad_token_id, load_causal_lm
from bridge_ray.engines.precision import resolve_precision
from bridge_ray.model_paths import copy_tokenizer
from bridge_ray.policy_learner.batch import PolicyBatch, policy_batch
from bridge_ray.policy_learner.lr_schedule import lr_scheduler
from bridge_ray.policy_learner.objective import causal_lm, policy_objective, sequence_log_probs, with_learner_old_logp
from bridge_ray.policy_learner.rag_term import accumulate_rag_terms, rank_turns
from bridge_ray.runtime.calls import get_within
from bridge_ray.runtime.model_process import skip_unused_transformers_imports
from bridge_ray.runtime.placement import role_device
from bridge_ray.runtime.rendezvous import rendezvous_address

# The forward passes of a policy update, by kind: the π_old pass before the first step (old_logp), the
# training forwards (train) and the KL reference's (reference). Each step counts, per kind, its forwards and
# the tokens they fed (padding included); attended_tokens counts the training forwards' unpadded tokens.
FORWARD_KINDS = ("old_logp", "train", "reference")
FORWARD_COUNTS = (*(f"{kind}_{n}" for kind in FORWARD_KINDS for n in ("forwards", "tokens")), "attended_tokens")
# Metrics that are per-rank partial sums of one mini-batch (the rest are the same on every rank).
SHARD_SUMS = (
    "loss",
    "pg_loss",
    "kl",
    "entropy",
    "clipfrac",
    "approx_kl",
    "ratio_mean",
    "action_tokens",
    "old_logp_gap",
    "rag_nll",
    "rag_nll_lower",
    *FORWARD_COUNTS,
)
# Metrics of an update that are totals over its optimizer steps (the rest are means over them).
STEP_TOTALS = ("action_tokens", *FORWARD_COUNTS)


def optimizer_steps(config: Config) -> int:
    """Optimizer steps in the whole run: the horizon of the lr schedule."""
    per_round = math.ceil(config.rollout.questions_per_batch / config.optim.mini_batch_size) * config.optim.epochs
    return config.run.rounds * per_round


@dataclass(frozen=True)
class PolicyRows:
    """The rows of a round's rollouts the policy trains on, by reference: the trajectories never pass through
    the coordinator, each rank fetches them and builds its batch."""

    trajectories: list[ray.ObjectRef]  # each a sampler's share (list[Trajectory]), in the round's order
    rows: list[int]  # indices into their concatenation
    advantages: torch.Tensor  # [len(rows)], the GRPO advantage of each row

    def batch(self, pad_id: int, timeout_s: float) -> PolicyBatch:
        """The rows' batch, their trajectories fetched within ``timeout_s`` (``run.call_timeout_s``)."""
        every = [t for part in get_within(self.trajectories, timeout_s, "policy learner rank (trajectories)")
                 for t in part]
        return policy_batch([every[i] for i in self.rows], self.advantages, pad_id)


@dataclass(frozen=True)
class RagTerms:
    """The L_RAG terms of a Drop or two-state round (Section 3.2), by reference: each rank fetches them.

    Every optimizer step of the round adds ``γ ∇θ L_RAG(θ, η_γ)`` (and for two-state ``− γ ∇θ L_RAG(θ, η*)``)
    to the RL gradient, ``L_RAG`` the mean over all of the round's retrieval turns at the step's θ. η*'s term
    is over the logged candidates, or with ``two_state.candidates: own`` over its own (``lower_groups``).
    """

    estimator: str  # "drop" or "two_state"
    gamma: float
    groups: list[ray.ObjectRef]  # each sampler's share: list[PrefixGroup], one per retrieval turn, in round order
    penalized: ray.ObjectRef  # RetrievalRows of η_γ, after this round's retriever update
    lower: ray.ObjectRef | None = None  # RetrievalRows of η*, after its own update (two_state)
    lower_groups: list[ray.ObjectRef] | None = None  # like groups, of η*'s own candidates (candidates: own)

    def share(self, rank: int, world_size: int, timeout_s: float) -> RagShare:
        """Rank ``rank``'s turns, each state's groups and ``log ρ`` of them (see :func:`rank_turns`), fetched
        within ``timeout_s`` (``run.call_timeout_s``)."""
        if (self.estimator == "two_state") != (self.lower is not None):
            raise ValueError(f"estimator {self.estimator!r} with{'' if self.lower else 'out'} eta*'s log rho")

        def fetch(refs: list[ray.ObjectRef]) -> list:
            return get_within(refs, timeout_s, "policy learner rank (L_RAG terms)")

        groups = [g for part in fetch(self.groups) for g in part]
        own = [g for part in fetch(self.lower_groups) for g in part] if self.lower_groups is not None else groups
        states: list[RetrievalRows] = fetch([self.penalized] + ([self.lower] if self.lower is not None else []))
        state_groups = [groups, own][: len(states)]
        if any(len(g) != s.candidate_mask.shape[0] or s.log_rho.shape != s.candidate_mask.shape
               for g, s in zip(state_groups, states, strict=True)):
            raise RuntimeError(f"L_RAG terms: {[len(g) for g in state_groups]} scored turns but log rho "
                               f"{[tuple(s.log_rho.shape) for s in states]}, "
                               f"masks {[tuple(s.candidate_mask.shape) for s in states]}")
        turns, weights = rank_turns(states[0].candidate_mask, rank, world_size)
        coefficients = [self.gamma, -self.gamma][: len(states)]
        return RagShare([[g[m] for m in turns] for g in state_groups], [s.log_rho[turns] for s in states],
                        coefficients, [s.candidate_mask[turns] for s in states], weights)


@dataclass(frozen=True)
class RagShare:
    """One rank's part of :class:`RagTerms`: the arguments of :func:`accumulate_rag_terms`, one entry per
    retriever state (η_γ, then η*) in ``groups``, ``log_rhos``, ``coefficients`` and ``candidate_masks``."""

    groups: list[list[PrefixGroup]]
    log_rhos: list[torch.Tensor]
    coefficients: list[float]
    candidate_masks: list[torch.Tensor]
    turn_weights: list[float]


def rank_plan(batch: PolicyBatch, config: Config, version: int, rank: int, world_size: int) -> list[list[PolicyBatch]]:
    """Rank ``rank``'s micro-batches of every mini-batch of every epoch, in step order.

    Every rank cuts the same batch the same way: mini-batches are whole questions drawn by a generator seeded
    with (run.seed, version), so a resumed run draws the same ones, and token weights are computed per
    mini-batch before sharding (into runs of similar length with ``learner.length_buckets``).
    """
    if batch.num_rows == 0:
        raise ValueError("the policy learner got an empty PolicyBatch")
    generator = torch.Generator().manual_seed(config.run.seed * 1_000_003 + version)
    plan = []
    learner = config.learner
    for _ in range(config.optim.epochs):
        for mini in batch.mini_batches(config.optim.mini_batch_size, generator):
            weighted = mini.with_token_weights(config.algorithm.grpo.loss_agg)
            plan.append(weighted.shard(world_size, learner.micro_batch_size, learner.length_buckets)[rank])
    return plan


def dropout_active(model: torch.nn.Module) -> bool:
    """Whether ``model``'s training forward differs from its eval-mode forward: a dropout module with p > 0
    (LoRA's included), or a dropout rate in its config (HF attention applies ``attention_dropout`` without a
    module). Only without either is a training forward's output π_old itself."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    settings = causal_lm(model).config.to_dict()
    return any(isinstance(v, float) and v > 0 and ("dropout" in k or "pdrop" in k) for k, v in settings.items())


def forward_counts(kind: str, micro: PolicyBatch) -> dict[str, float]:
    """One ``kind`` forward over ``micro``: its share of :data:`FORWARD_COUNTS`."""
    counts = {f"{kind}_forwards": 1.0, f"{kind}_tokens": float(micro.input_ids.numel())}
    if kind == "train":
        counts["attended_tokens"] = float(micro.attention_mask.sum())
    return counts


def forward_record(metrics: dict[str, float]) -> dict[str, Any]:
    """An update's :data:`FORWARD_COUNTS` (totals over its steps and ranks) as the policy update's
    ``phases.jsonl`` record holds them: ``forwards`` and ``forward_tokens`` (padding included) by kind, and
    the training forwards' ``attended_tokens``."""
    return {
        "forwards": {kind: int(metrics[f"{kind}_forwards"]) for kind in FORWARD_KINDS},
        "forward_tokens": {kind: int(metrics[f"{kind}_tokens"]) for kind in FORWARD_KINDS},
        "attended_tokens": int(metrics["attended_tokens"]),
    }


def _add(sums: dict[str, float], parts: dict[str, Any]) -> None:
    for key, value in parts.items():
        sums[key] = sums.get(key, 0.0) + float(value)


def merge_ranks(per_rank: tuple[dict[str, float], ...]) -> dict[str, float]:
    """One optimizer step's metrics: shard sums added over ranks, rank-independent values from rank 0."""
    return {key: sum(r[key] for r in per_rank) if key in SHARD_SUMS else value for key, value in per_rank[0].items()}


class ExportReturns(NamedTuple):
    """:meth:`PolicyLearnerRank.export`'s returns: the version (waited on), the weights (rank 0's; by ref)."""

    version: int
    weights: PolicyWeights | None


class PolicyLearnerRank:
    """One data-parallel rank (a Ray actor made by :class:`PolicyLearnerGroup`)."""

    def __init__(self, config: Config, model_path: str, rank: int, world_size: int) -> None:
        skip_unused_transformers_imports()
        self.config, self.model_path, self.rank, self.world_size = config, model_path, rank, world_size
        self.version = 0
        self.on_gpu = role_device() == "cuda"  # Ray exposes this rank's GPU as cuda:0
        # DeepSpeed picks its accelerator when first imported here: this rank's device, whatever the job's
        # environment says (the Makefile exports cpu for CPU machines).
        os.environ["DS_ACCELERATOR"] = "cuda" if self.on_gpu else "cpu"
        self.device = torch.device("cuda", 0) if self.on_gpu else torch.device("cpu")
        self.lora = config.learner.lora.enabled
        self.zero3 = config.learner.zero_stage == 3
        # bf16 weights go through DeepSpeed's bf16 mode; bf16 autocast keeps fp32 weights and optimizer.
        self.precision = resolve_precision(config.learner.dtype, "learner.dtype", self.device.type)
        self.bf16 = self.precision.weights == torch.bfloat16
        self.temperature = config.rollout.temperature  # the learner's π is the rollout's softmax(logits / T)
        torch.set_num_threads(config.learner_threads())

    def rendezvous(self) -> tuple[str, int]:
        return rendezvous_address()

    def setup(self, address: tuple[str, int]) -> None:
        """Join the process group at rank 0's ``(MASTER_ADDR, MASTER_PORT)``, load the model and build the DeepSpeed
        engine (and the reference)."""
        master_addr, master_port = address
        from bridge_ray.policy_learner import deepspeed_engine as dse  # DeepSpeed, peft: learner actors only

        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )
        self.dse = dse  # for weights() and save(), which run after setup()
        learner, optim = self.config.learner, self.config.optim
        dse.init_distributed(self.on_gpu)
        torch.manual_seed(self.config.run.seed)
        ds_config = dse.engine_config(learner, optim, self.world_size, self.bf16)
        if self.zero3:
            self._hf_ds_config = dse.zero3_loading(ds_config)  # kept: ZeRO-3 loading holds while it lives
        model = self._load_model()
        if learner.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.lora:
            model = dse.with_lora(model, learner.lora)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)
        scheduler = lr_scheduler(optimizer, learner, optim, optimizer_steps(self.config))
        self.engine = dse.initialize(model, ds_config, optimizer, scheduler)
        self.engine.checkpoint_engine = dse.RestrictedCheckpointEngine()
        if self.lora:
            dse.exclude_tied_frozen_weights(self.engine)
        # With LoRA the reference is the base model with the adapter switched off: no second copy.
        self.reference = None
        if self.config.algorithm.grpo.kl_coef > 0 and not self.lora:
            reference = self._load_model().requires_grad_(False)
            ref_config = dse.reference_config(learner, self.world_size, self.bf16)
            self.reference = dse.initialize(reference, ref_config)
            self.reference.eval()

    def _load_model(self) -> torch.nn.Module:
        """On the CPU; ``deepspeed.initialize`` moves it to this rank's device (ZeRO-3 partitions must not be moved)."""
        return load_causal_lm(self.model_path, self.precision.weights, self.config.policy.trust_remote_code)

    def _log_probs(
        self, model: torch.nn.Module, micro: PolicyBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 log-probs (and entropies); the forward runs in the learner's precision, the backward after it."""
        with self.precision.context(self.device.type):
            return sequence_log_probs(model, micro, with_entropy, temperature=self.temperature)

    def _reference_logp(self, micro: PolicyBatch) -> torch.Tensor | None:
        if self.config.algorithm.grpo.kl_coef == 0:
            return None
        with torch.no_grad():
            if self.lora:
                with self.engine.module.disable_adapter():
                    return self._log_probs(self.engine, micro)[0]
            return self._log_probs(self.reference, micro)[0]

    def _with_learner_old_logp(self, plan: list[list[PolicyBatch]]) -> tuple[list[list[PolicyBatch]], list[dict]]:
        """``plan`` with π_old from the current weights, and each step's ``old_logp_gap`` and forward counts.

        One no-grad forward per micro-batch (every rank runs the same number, as ZeRO-3 needs), in eval
        mode: π_old is the policy itself, without dropout. The micro-batches stay on the CPU.
        """
        grpo = self.config.algorithm.grpo
        self.engine.eval()
        prepared, starts = [], []
        with torch.no_grad():
            for micro_batches in plan:
                step, sums = [], {"old_logp_gap": 0.0}
                for micro in micro_batches:
                    learner_logp = self._log_probs(self.engine, micro.to(self.device))[0].cpu()
                    ready, gap = with_learner_old_logp(micro, learner_logp, grpo)
                    step.append(ready)
                    _add(sums, {"old_logp_gap": gap, **forward_counts("old_logp", micro)})
                prepared.append(step)
                starts.append(sums)
        return prepared, starts

    @cached_property
    def reuses_old_logp(self) -> bool:
        """Whether the update's first step takes π_old from its own training forward, detached: asked for
        (``learner.reuse_old_logp``) and exact, the model having no active dropout (:func:`dropout_active`)."""
        return self.config.learner.reuse_old_logp and not dropout_active(self.engine.module)

    @cached_property
    def pad_id(self) -> int:
        return config_pad_token_id(self.engine.module.config)

    def train_on(self, source: PolicyBatch | PolicyRows, rag: RagTerms | None = None) -> list[dict[str, float]]:
        """One policy update on a round's batch, or on the rows to build it from: this rank's share of the plan
        every rank cuts alike, plus its share of the round's L_RAG terms (``rag``); returns :meth:`train`'s
        metrics."""
        timeout_s = self.config.run.call_timeout_s
        batch = source if isinstance(source, PolicyBatch) else source.batch(self.pad_id, timeout_s)
        share = rag.share(self.rank, self.world_size, timeout_s) if rag is not None else None
        return self.train(rank_plan(batch, self.config, self.version, self.rank, self.world_size), share)

    def train(self, plan: list[list[PolicyBatch]], rag: RagShare | None = None) -> list[dict[str, float]]:
        """One optimizer step per mini-batch of ``plan``; returns per-step metrics (shard sums, see SHARD_SUMS).

        The whole plan is one round's batch, so π_old (``algorithm.grpo.old_logp: learner``) and the TIS
        weights come from the weights before the first step: the first step's from its own training forward
        when that is exact (:attr:`reuses_old_logp`), the other steps' from a pass over them before the first
        step (:meth:`_with_learner_old_logp`). With ``rag`` every step's gradient also holds the estimator's
        L_RAG terms (:meth:`_rag_backward`). Each step counts the forwards it ran (:data:`FORWARD_COUNTS`).
        """
        grpo = self.config.algorithm.grpo
        learner_old_logp = grpo.old_logp == "learner" or grpo.tis_cap is not None
        own_first = learner_old_logp and self.reuses_old_logp
        starts: list[dict[str, float]] = [{} for _ in plan]
        if learner_old_logp:
            skip = int(own_first)
            prepared, later = self._with_learner_old_logp(plan[skip:])
            plan, starts = plan[:skip] + prepared, [{"old_logp_gap": 0.0}] * skip + later
        self.engine.train()
        steps = []
        for index, (micro_batches, start) in enumerate(zip(plan, starts, strict=True)):
            sums = {"action_tokens": 0.0, **dict.fromkeys(FORWARD_COUNTS, 0.0), **start}
            for micro in micro_batches:
                micro = micro.to(self.device)
                ref_logp = self._reference_logp(micro)
                logp, entropy = self._log_probs(self.engine, micro, with_entropy=grpo.entropy_coef > 0)
                if own_first and index == 0:
                    micro, gap = with_learner_old_logp(micro, logp, grpo)
                    _add(sums, {"old_logp_gap": gap})
                loss, stats = policy_objective(logp, micro, grpo, ref_logp, entropy)
                # DeepSpeed averages gradients over ranks, but the shards' losses already sum to the
                # mini-batch loss: scale back up so the reduced gradient is the mini-batch gradient.
                self.engine.backward(loss * self.world_size)
                _add(sums, {**stats, "action_tokens": micro.action_mask.sum(), **forward_counts("train", micro)})
                if ref_logp is not None:
                    _add(sums, forward_counts("reference", micro))
            if rag is not None:
                sums |= self._rag_backward(rag)
            lr = float(self.engine.get_lr()[0])
            self.engine.step()
            steps.append({**sums, "grad_norm": float(self.engine.get_global_grad_norm()), "lr": lr})
        self.version += 1
        return steps

    def _rag_backward(self, rag: RagShare) -> dict[str, float]:
        """This rank's turns of ``Σ_s c_s L_RAG(θ, η_s)`` into the step's gradient; its partial ``L_RAG`` sums.

        Scaled like the RL micro-batches (the turn weights of all ranks sum to 1, DeepSpeed averages over
        ranks), so the reduced gradient holds ``c_s ∇θ L_RAG`` of the mean over all the round's turns. In eval
        mode: no dropout, and no gradient checkpointing, which would drop the prefix's KV cache the k
        continuations share.
        """
        self.engine.eval()
        try:
            sums = accumulate_rag_terms(
                self.engine.module, rag.groups, [r.to(self.device) for r in rag.log_rhos], rag.coefficients,
                [m.to(self.device) for m in rag.candidate_masks], rag.turn_weights,
                batch_size=self.config.policy.score_batch_size, pad_token_id=self.pad_id,
                backward=lambda loss: self.engine.backward(loss * self.world_size), precision=self.precision,
            )
        finally:
            self.engine.train()
        return dict(zip(("rag_nll", "rag_nll_lower")[: len(sums)], sums, strict=True))

    def export(self) -> ExportReturns:
        """The version (the caller waits on it) and :meth:`weights` (by ref)."""
        return ExportReturns(version=self.version, weights=self.weights())

    def weights(self) -> PolicyWeights | None:
        """The weights to sync (collective under ZeRO-3); rank 0 returns them, the others None."""
        keep = self.rank == 0
        module = self.engine.module
        if self.lora:
            tensors = self.dse.export_adapter(module, self.zero3, keep)
            # peft keeps target_modules as a set: sorted lists make it the JSON the samplers write out
            adapter_config = json.loads(json.dumps(module.peft_config["default"].to_dict(), default=sorted))
        else:
            tensors, adapter_config = self.dse.export_weights(module, self.zero3, keep, merge_lora=False), None
        return PolicyWeights(self.version, tensors, adapter_config) if keep else None

    def save(self, directory: str, tokenizer_path: str | None) -> None:
        """DeepSpeed state (every rank its partition), and on rank 0 the HF policy (+ peft adapter)."""
        root = Path(directory)
        self.engine.save_checkpoint(
            str(root / POLICY_STATE_DIR),
            tag=POLICY_STATE_TAG,
            client_state={"version": self.version},
            exclude_frozen_parameters=self.lora,
        )
        keep = self.rank == 0
        module = self.engine.module
        weights = self.dse.export_weights(module, self.zero3, keep, merge_lora=self.lora)
        adapter = self.dse.export_adapter(module, self.zero3, keep) if self.lora else {}
        if not keep:
            return
        base = module.get_base_model() if self.lora else module
        base.save_pretrained(str(root / POLICY_DIR), state_dict=weights, safe_serialization=True)
        if self.lora:
            self.dse.save_adapter(module, adapter, root / POLICY_ADAPTER_DIR)
        if tokenizer_path is not None:
            copy_tokenizer(tokenizer_path, root / POLICY_DIR)

    def load(self, directory: str) -> int:
        """Restore weights, optimizer, lr schedule and version from :meth:`save`'s output; returns the version."""
        state = Path(directory) / POLICY_STATE_DIR
        if not (state / POLICY_STATE_TAG).is_dir():
            raise FileNotFoundError(f"no policy learner state at {state / POLICY_STATE_TAG}")
        path, client_state = self.engine.load_checkpoint(
            str(state), tag=POLICY_STATE_TAG, load_module_strict=not self.lora
        )
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no loadable state at {state / POLICY_STATE_TAG}")
        self.version = int(client_state["version"])
        return self.version

    def shutdown(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
