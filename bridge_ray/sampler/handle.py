"""The samplers as the coordinator calls them: a typed handle over their :class:`ActorGroup`.

Each method sends one :class:`Sampler` method and returns its :class:`Call`, whose refs are named by the
NamedTuple the method returns (``call.out.trajectories``), so that no caller names a method or reads a ref by
position. The samplers restart under :attr:`Restart.RESEND` (``roles.sampler.max_restarts`` times): a revived
sampler is first sent what :class:`Serving` says the run serves now (:meth:`SamplerGroup.prime`), then its dead
call; :meth:`SamplerGroup.collect` reports the calls it sent again. Its limits: ``roles.sampler.startup_timeout_s``
for the engines to load, ``run.call_timeout_s`` for a call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch

from bridge_ray.config import Config
from bridge_ray.data.qa import QuestionRecord
from bridge_ray.runtime.actor_group import ActorGroup, Call, Collected, NamedActors, Restart, RoleSpec
from bridge_ray.sampler.sampler import RolloutReturns, Sampler, ScoreReturns
from bridge_ray.sampler.summary import RolloutSummary

ROLE = "sampler"
RESTART = Restart.RESEND


@dataclass
class Rollouts:
    """A round's rollouts as collected: the summaries (the coordinator's), the trajectories in the object store."""

    summaries: list[RolloutSummary]
    shares: list[Call[RolloutReturns]]  # each sampler's share as answered, in the summaries' order
    resent: frozenset[int]  # the shares sent again to a revived sampler (their scoring must follow them)

    @property
    def trajectories(self) -> list[ray.ObjectRef]:
        return [share.out.trajectories for share in self.shares]

    @property
    def uids(self) -> list[str]:
        return [s.uid for s in self.summaries]

    @property
    def rewards(self) -> torch.Tensor:
        return torch.tensor([s.reward for s in self.summaries], dtype=torch.float32)


@dataclass(frozen=True)
class Serving:
    """What every sampler must serve now: the retriever adapter and the policy weights (None: the ones it
    started with)."""

    adapter: ray.ObjectRef | None
    weights: ray.ObjectRef | None


class SamplerGroup:
    """The sampler actors; ``serving`` says what a revived one must be sent before its dead call."""

    def __init__(self, group: ActorGroup, serving: Callable[[], Serving]) -> None:
        self.group, self.serving = group, serving
        group.prime = self.prime

    @classmethod
    def start(
        cls, config: Config, spec: RoleSpec, shards: NamedActors, serving: Callable[[], Serving], **kwargs: Any
    ) -> SamplerGroup:
        """``spec.count`` samplers of ``config`` over the shard holders ``shards`` (by name: Ray may restart a
        sampler, and handles in its arguments would make Ray warn about it), created without waiting for their
        engines (:meth:`ready`); ``kwargs`` go to every :class:`Sampler`, each seeded from ``run.seed``."""
        return cls(ActorGroup.start(
            ROLE, Sampler, spec, RESTART, label="sampler", args=(config, shards), kwargs=kwargs,
            per_actor=lambda i: {"seed": config.run.seed * 1000 + i},
            call_timeout_s=config.run.call_timeout_s, startup_timeout_s=config.roles.sampler.startup_timeout_s,
        ), serving)

    def ready(self) -> None:
        """Wait until every engine has loaded, within ``roles.sampler.startup_timeout_s``."""
        self.group.ready()

    def __len__(self) -> int:
        return len(self.group)

    @property
    def revived(self) -> list[int]:
        """Indices of the samplers revived since the owner last cleared this list."""
        return self.group.revived

    def rollout(
        self, index: int, questions: list[QuestionRecord], group_size: int, seed: int
    ) -> Call[RolloutReturns]:
        return self.group.call(index, Sampler.rollout, questions, group_size, seed, returns=RolloutReturns)

    def score(self, index: int, trajectories: ray.ObjectRef, with_groups: bool) -> Call[ScoreReturns]:
        """The answer scoring of ``trajectories`` (a share of a round's, or η*'s own candidates for them) on
        sampler ``index``."""
        return self.group.call(index, Sampler.score, trajectories, with_groups, returns=ScoreReturns)

    def set_adapter(self, adapter: ray.ObjectRef) -> list[Call]:
        """Every sampler serves ``adapter`` (each call returns the retriever version it then serves)."""
        return self.group.call_all(Sampler.set_retriever_adapter, adapter)

    def update_policy(self, weights: ray.ObjectRef) -> list[Call]:
        """Every sampler serves ``weights`` (each call returns the policy version it then serves)."""
        return self.group.call_all(Sampler.update_policy, weights)

    def evaluate(self, questions: Sequence[QuestionRecord], pieces_per_actor: int) -> list[Call]:
        """Greedy rollouts of ``questions`` cut into pieces dealt round-robin (:meth:`ActorGroup.call_split`)."""
        return self.group.call_split(Sampler.evaluate, questions, pieces_per_actor=pieces_per_actor)

    def collect(self, calls: Sequence[Call], what: str) -> Collected:
        return self.group.collect(calls, what)

    def prime(self, index: int) -> list[Call]:
        """Make revived sampler ``index`` serve the run's current adapter and policy weights."""
        serving = self.serving()
        return [self.group.call(index, Sampler.restore, serving.adapter, serving.weights)]

    def shutdown(self) -> None:
        self.group.shutdown()
