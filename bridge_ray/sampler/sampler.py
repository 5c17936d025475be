"""The sampler actor: a generation engine, a query-encoder copy and the search agent, on one device bundle.

It runs the rollouts of its share of a round's questions, scores the answer likelihoods of their
retrieval turns with the same policy weights, and takes new policy weights and retriever adapters
between rounds. Everything it returns is tagged with the versions it used. Its rollout and scoring calls
have several returns, a NamedTuple declared beside each (:class:`RolloutReturns`, :class:`ScoreReturns`), whose
fields :class:`~bridge_ray.sampler.handle.SamplerGroup`'s calls read by name as refs: something small for the
coordinator first, then the trajectories, scores and scored token ids, which stay in the object store for the
learners.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import save_file

from bridge_ray.agent.loop import SearchAgent, gold_passages
from bridge_ray.agent.outcomes import QuestionOutcome, question_outcome
from bridge_ray.agent.scoring import score_answers
from bridge_ray.agent.types import Trajectory
from bridge_ray.config import Config, derive
from bridge_ray.data.qa import QuestionRecord
from bridge_ray.engines.base import PolicyWeights, PrefixGroup
from bridge_ray.engines.factory import build_engine
from bridge_ray.retrieval.client import RetrieverClient, ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder, adapter_init_seed
from bridge_ray.runtime.actor_group import NamedActors
from bridge_ray.runtime.calls import StateLost, restarted_actor
from bridge_ray.runtime.model_process import skip_unused_transformers_imports
from bridge_ray.runtime.placement import role_device
from bridge_ray.sampler.summary import RolloutSummary, summarize_rollout
from bridge_ray.shard_holder.handle import ShardHolders

AnswerScores = list[list[list[float]]]  # per trajectory, per retrieval turn, per candidate


class RolloutReturns(NamedTuple):
    """:meth:`Sampler.rollout`'s returns: the summaries for the coordinator, the trajectories for the learners."""

    summaries: list[RolloutSummary]
    trajectories: list[Trajectory]


class ScoreReturns(NamedTuple):
    """:meth:`Sampler.score`'s returns: the turns scored (the coordinator waits on it), the answer likelihoods
    for the retriever learner, and the scored token ids for the policy ranks' L_RAG terms (None unless asked)."""

    turns: int
    answer_logp: AnswerScores
    groups: list[PrefixGroup] | None


def greedy(config: Config) -> Config:
    """The same job with greedy decoding (evaluation)."""
    return derive(config, {"rollout.temperature": 0.0}, source="greedy decoding")


class Sampler:
    """A Ray actor of the graph (:class:`~bridge_ray.sampler.handle.SamplerGroup`), or in-process over a local
    ShardSet (``eval``)."""

    def __init__(
        self,
        config: Config,
        shards: ShardSet | NamedActors,
        *,
        seed: int,
        adapter_dir: str | None = None,
        retriever_version: int = 0,
        model: str | None = None,
    ) -> None:
        skip_unused_transformers_imports()
        if config.roles.torch_threads:
            torch.set_num_threads(config.roles.torch_threads)
        torch.manual_seed(seed)
        if model is not None:
            config = derive(config, {"policy.model": model}, source="the sampler's model")
        self.config = config
        if isinstance(shards, NamedActors):  # an actor of the graph: the shard holders by name, restart-safe
            shards = ShardSet(ShardHolders.attach(shards, config))
        self.engine = build_engine(config, seed=seed, device=role_device())
        self.tokenizer = self.engine.tokenizer
        objective = config.algorithm.retriever
        self.client = RetrieverClient(
            QueryEncoder.from_config(
                config.retrieval, adapter_dir, device=role_device(), init_seed=adapter_init_seed(config.run.seed)
            ),
            shards,
            num_candidates=objective.num_candidates,
            num_shown=objective.num_shown,
            version=retriever_version,
            candidates=objective.candidates,
        )
        self.agent = SearchAgent.from_config(self.engine, self.client, self.tokenizer, config)
        self.greedy_agent = SearchAgent.from_config(self.engine, self.client, self.tokenizer, greedy(config))
        # Ray re-runs this constructor when it restarts the actor: this is then the run's starting state, not the
        # one it serves now. Every call but restore() refuses until the group has sent that (SamplerGroup.prime).
        self.unrestored = restarted_actor()

    def _check_restored(self) -> None:
        if self.unrestored:
            raise StateLost("sampler restarted by Ray and not yet sent the run's current adapter and policy")

    def restore(self, adapter: tuple[dict[str, torch.Tensor], int] | None, weights: PolicyWeights | None) -> int:
        """After a restart: serve the run's current retriever adapter and policy weights (None: the ones this
        sampler started with); returns the policy version now served."""
        if adapter is not None:
            self.client.set_adapter(*adapter)
        if weights is not None:
            self._serve_policy(weights)
        self.unrestored = False
        return self.engine.weight_version

    def rollout(self, questions: list[QuestionRecord], group_size: int, seed: int) -> RolloutReturns:
        """``group_size`` trajectories per question, sampled from ``seed``, and their summaries: the same share with
        the same seed and weights gives the same tokens, whatever this engine sampled before (a resumed run, a
        revived sampler)."""
        self._check_restored()
        self.engine.reseed(seed)
        trajectories = self.agent.rollout(questions, group_size)
        by_uid = {q.uid: q for q in questions}
        return RolloutReturns(summaries=[summarize_rollout(t, by_uid[t.uid]) for t in trajectories],
                              trajectories=trajectories)

    def score(self, trajectories: list[Trajectory], with_groups: bool = False) -> ScoreReturns:
        """The number of retrieval turns scored, ``log p(y | h_t, d)`` per trajectory, per retrieval turn, per
        candidate (eq. lrag's p_theta term), and with ``with_groups`` the token ids they were scored from (else
        None): one :class:`PrefixGroup` per retrieval turn in the same order, so that the policy ranks (which hold
        no corpus) can compute the same likelihoods with gradients in θ, the Drop and two-state estimators' L_RAG
        terms. Only their rounds ask.
        """
        self._check_restored()
        scores, groups = score_answers(
            self.engine, trajectories, self.tokenizer, self.agent.renderer, self.client.passages
        )
        answer_logp = [[turn.tolist() for turn in per_trajectory] for per_trajectory in scores]
        return ScoreReturns(turns=sum(map(len, scores)), answer_logp=answer_logp,
                            groups=groups if with_groups else None)

    def evaluate(self, questions: list[QuestionRecord]) -> list[QuestionOutcome]:
        """One greedy trajectory per question, scored for the results table; ``eval.oracle_retrieval`` shows
        every search the question's gold passages."""
        self._check_restored()
        gold = gold_passages(questions, self.client.passages) if self.config.eval.oracle_retrieval else None
        trajectories = self.greedy_agent.rollout(questions, 1, gold=gold)
        return [question_outcome(q, t) for q, t in zip(questions, trajectories, strict=True)]

    def update_policy(self, weights: PolicyWeights) -> int:
        """Serve new policy weights (full state dict, or a LoRA adapter); returns the version now served."""
        self._check_restored()  # a retriever-adapter push alone would leave a restarted sampler's policy stale
        return self._serve_policy(weights)

    def _serve_policy(self, weights: PolicyWeights) -> int:
        if weights.adapter_config is None:
            self.engine.update_weights(weights.tensors, weights.version)
        else:
            with tempfile.TemporaryDirectory(prefix="policy-adapter-") as tmp:
                save_file(weights.tensors, str(Path(tmp) / "adapter_model.safetensors"))
                (Path(tmp) / "adapter_config.json").write_text(json.dumps(weights.adapter_config))
                self.engine.load_adapter(tmp, weights.version)
        return self.engine.weight_version

    def set_retriever_adapter(self, adapter: tuple[dict[str, torch.Tensor], int]) -> int:
        """Serve a new query adapter, ``(state dict, version)`` as the retriever learner exports it."""
        self._check_restored()
        self.client.set_adapter(*adapter)
        return self.client.version
