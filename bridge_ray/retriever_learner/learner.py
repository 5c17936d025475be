"""The retriever-LoRA learner actor: the query encoder with its trainable adapter and optimizer.

It reads g(d) of the logged candidates from the shard holders, so it never encodes a document, and builds its batch
itself from the round's trajectories and answer scores, which it receives by reference. The new adapter leaves as a
ref too, for the samplers: its calls have several returns, each a NamedTuple declared here beside its method, whose
fields :mod:`bridge_ray.retriever_learner.handle` reads by name as refs. With the Drop and two-state estimators it
also returns what the policy ranks need for their ``L_RAG(θ, η)`` terms (:class:`RetrievalRows`) and, for two-state,
holds η* (:class:`~bridge_ray.retriever_learner.two_state.LowerLevelState`) and updates it in its own call; with
``two_state.candidates: own`` a call per sampler share first returns η*'s own candidates for the samplers to score.
It is never restarted: its death rolls the run back to the last checkpoint, which it is then rebuilt from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import ray
import torch

from bridge_ray.agent.types import RetrievalRows, Trajectory
from bridge_ray.checkpoint import RETRIEVER_ADAPTER_DIR, RETRIEVER_OPTIMIZER_FILE
from bridge_ray.config import Config
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder, adapter_init_seed
from bridge_ray.retriever_learner.two_state import LowerLevelState
from bridge_ray.retriever_learner.update import RetrieverBatch, RetrieverUpdater
from bridge_ray.runtime.actor_group import NamedActors
from bridge_ray.runtime.calls import get_within
from bridge_ray.runtime.model_process import skip_unused_transformers_imports
from bridge_ray.runtime.placement import role_device
from bridge_ray.shard_holder.handle import ShardHolders

# (adapter state dict, retriever version): what the samplers load (``Sampler.set_retriever_adapter``).
Adapter = tuple[dict[str, torch.Tensor], int]


class RetrieverUpdateReturns(NamedTuple):
    """:meth:`RetrieverLearner.update`'s returns: (figures, new version) for the coordinator, the new adapter for
    the samplers, and with Drop and two-state the updated η_γ's :class:`RetrievalRows` for the policy ranks (None
    for BRIDGE)."""

    stats: tuple[dict[str, float], int]
    adapter: Adapter
    rows: RetrievalRows | None


class OwnCandidateReturns(NamedTuple):
    """:meth:`RetrieverLearner.own_candidates`' returns: the retrieval turns of one share (for the coordinator),
    and that share's trajectories with η*'s own candidates, which its sampler scores."""

    turns: int
    trajectories: list[Trajectory]


class LowerUpdateReturns(NamedTuple):
    """:meth:`RetrieverLearner.update_lower`'s returns: η*'s figures, and its :class:`RetrievalRows`."""

    stats: dict[str, float]
    rows: RetrievalRows


class AdapterReturns(NamedTuple):
    """:meth:`RetrieverLearner.adapter`'s returns: its version (the caller waits on it), and the adapter the
    samplers load (by ref)."""

    version: int
    adapter: Adapter


def retriever_batch(
    trajectories: Sequence[Trajectory],
    answer_logp: Sequence[Sequence[Sequence[float]]],
    advantages: torch.Tensor,
    turns: Literal["all", "last"] = "all",
) -> RetrieverBatch:
    """The logged retrieval turns that train the retriever, each with its trajectory's advantage
    (eq. app_retrieval_rl_loss's A_i): every turn, or with ``turns="last"`` each trajectory's last search."""
    rows = [
        (turn, logp, float(advantages[i]))
        for i, t in enumerate(trajectories)
        for n, (turn, logp) in enumerate(zip(t.retrieval_turns, answer_logp[i], strict=True))
        if turns == "all" or n == len(t.retrieval_turns) - 1
    ]
    return RetrieverBatch.from_turns(
        [turn.query for turn, _, _ in rows],
        [turn.doc_ids for turn, _, _ in rows],
        [turn.scores for turn, _, _ in rows],
        [logp for _, logp, _ in rows],
        [adv for _, _, adv in rows],
    )


class RetrieverLearner:
    """Made a Ray actor by the graph (:class:`~bridge_ray.retriever_learner.handle.RetrieverLearnerGroup`), over the
    shard holders by name, or in-process over a :class:`ShardSet` (tests)."""

    def __init__(
        self, config: Config, shards: ShardSet | NamedActors, *, checkpoint_dir: str | None = None, version: int = 0
    ) -> None:
        skip_unused_transformers_imports()
        if config.roles.torch_threads:
            torch.set_num_threads(config.roles.torch_threads)
        seed = adapter_init_seed(config.run.seed)
        torch.manual_seed(seed)  # what the learner itself draws (LoRA dropout) repeats from run to run
        adapter = Path(checkpoint_dir) / RETRIEVER_ADAPTER_DIR if checkpoint_dir else None
        encoder = QueryEncoder.from_config(config.retrieval, adapter, device=role_device(), init_seed=seed)
        self.call_timeout_s = config.run.call_timeout_s  # also bounds fetching the refs a call is given
        self.shards = ShardSet(ShardHolders.attach(shards, config)) if isinstance(shards, NamedActors) else shards
        self._round: tuple[RetrieverBatch, torch.Tensor] | None = None  # this round's batch and its g(d)
        # two-state: the round's trajectories (each sampler's share) and advantages, until η*'s update
        self._logged: tuple[list[list[Trajectory]], torch.Tensor] | None = None
        self._own: dict[int, list[Trajectory]] = {}  # two_state.candidates own: η*'s candidates, by share
        self.estimator = config.algorithm.estimator
        objective = config.algorithm.retriever
        self.turns = objective.turns
        self.updater = RetrieverUpdater(
            encoder, self.doc_embeddings, objective, micro_batch_size=objective.micro_batch_size, version=version
        )
        if checkpoint_dir and (Path(checkpoint_dir) / RETRIEVER_OPTIMIZER_FILE).is_file():
            self.updater.load_optimizer(checkpoint_dir)
        self.lower = (
            LowerLevelState(
                config.retrieval, objective, self.shards, role_device(), checkpoint_dir, self.doc_embeddings, seed
            )
            if self.estimator == "two_state" else None
        )

    def doc_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """g(d) of ``ids`` from the shard holders; the round's candidates are fetched once for every use."""
        if self._round is not None and torch.equal(ids, self._round[0].doc_ids.clamp(min=0)):
            return self._round[1]
        return self.shards.doc_embeddings(ids)

    def update(
        self, trajectories: list[ray.ObjectRef], answer_logp: list[ray.ObjectRef], advantages: torch.Tensor
    ) -> RetrieverUpdateReturns:
        """One retriever update on every retrieval turn of the round: ``trajectories`` and ``answer_logp`` are each
        sampler's share (the scores' ``answer_logp``), ``advantages`` one per trajectory in the same order."""
        shares = self._fetch(trajectories, "the round's trajectories")
        self._set_round(shares, self._fetch(answer_logp, "the round's answer scores"), advantages)
        batch, g = self._round
        stats = self.updater.step(batch)
        log_rho = self.updater.log_rho(batch, g)  # the updated η_γ's: the round's step, and Drop's / two-state's rows
        stats["step_kl"] = self.updater.ranking_kl(batch, log_rho)
        rows = None if self.estimator == "bridge" else RetrievalRows(log_rho, batch.candidate_mask.cpu())
        if self.lower is None:
            self._round = None  # g(d) of every candidate: large, and only η*'s update still needs it
        else:
            self._logged = shares, advantages  # what η*'s own candidates are retrieved for
        return RetrieverUpdateReturns(stats=(stats, self.updater.version), adapter=self.adapter().adapter, rows=rows)

    def _fetch(self, refs: list[ray.ObjectRef], what: str) -> list:
        """The values behind refs this learner was sent, within ``run.call_timeout_s``."""
        return get_within(refs, self.call_timeout_s, f"retriever learner ({what})")

    def own_candidates(self, share: int) -> OwnCandidateReturns:
        """Two-state with ``two_state.candidates: own``: the trajectories of this round's share ``share`` with η*'s
        own top k for each of their logged queries (:meth:`LowerLevelState.own_trajectories`), for that share's
        sampler to score."""
        if self.lower is None or self._logged is None:
            raise RuntimeError("own_candidates needs estimator two_state and a round's update() first")
        own = self._own[share] = self.lower.own_trajectories(self._logged[0][share])
        return OwnCandidateReturns(turns=sum(len(t.retrieval_turns) for t in own), trajectories=own)

    def update_lower(self, answer_logp: list[ray.ObjectRef] | None = None) -> LowerUpdateReturns:
        """Two-state: η*'s update on the turns of this round's :meth:`update`, and the :class:`RetrievalRows` of
        the updated η* (the figures for the coordinator, the rows for the policy ranks). Without ``answer_logp``
        on the logged candidates; with ``two_state.candidates: own`` on η*'s own,
        every share's :meth:`own_candidates`, which ``answer_logp`` (each share's scores, in share order) scores."""
        if self.lower is None or self._logged is None:
            raise RuntimeError("update_lower needs estimator two_state and a round's update() first")
        if answer_logp is not None:
            if len(answer_logp) != len(self._own):
                raise RuntimeError(f"update_lower: {len(answer_logp)} shares scored, eta*'s own of {len(self._own)}")
            self._set_round([self._own[i] for i in range(len(answer_logp))],
                            self._fetch(answer_logp, "the scores of eta*'s own candidates"), self._logged[1])
        stats = self.lower.update_on(self._round[0])
        rows = self._rows(self.lower.updater)
        self._round, self._logged, self._own = None, None, {}
        return LowerUpdateReturns(stats=stats, rows=rows)

    def _set_round(
        self, shares: Sequence[Sequence[Trajectory]], answer_logp: Sequence[Sequence], advantages: torch.Tensor
    ) -> None:
        """The batch of every retrieval turn of ``shares`` (each sampler's, scored by ``answer_logp``) and g(d) of
        its candidates, fetched once for the update and the :class:`RetrievalRows` after it."""
        pairs = [pair for part, scores in zip(shares, answer_logp, strict=True)
                 for pair in zip(part, scores, strict=True)]
        batch = retriever_batch([t for t, _ in pairs], [s for _, s in pairs], advantages, self.turns)
        self._round = batch, self.shards.doc_embeddings(batch.doc_ids.clamp(min=0)).float()

    def _rows(self, updater: RetrieverUpdater) -> RetrievalRows:
        batch, g = self._round
        return RetrievalRows(updater.log_rho(batch, g), batch.candidate_mask.cpu())

    def adapter(self) -> AdapterReturns:
        """The version and the adapter (the caller waits on the version, the adapter goes by ref)."""
        return AdapterReturns(version=self.updater.version,
                              adapter=(self.updater.encoder.adapter_state_dict(), self.updater.version))

    def save(self, directory: str) -> None:
        self.updater.save(directory)
        if self.lower is not None:
            self.lower.save(directory)
