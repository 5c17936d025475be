"""The retriever learner as the coordinator calls it: a typed handle over its one-actor :class:`ActorGroup`.

Its calls with several returns read them by the names of the NamedTuple their method returns
(:mod:`bridge_ray.retriever_learner.learner`): the coordinator waits on the first (figures, versions), and hands
the others (the new adapter, η*'s own candidates, the :class:`~bridge_ray.agent.types.RetrievalRows`)
by reference to the samplers and the policy ranks. It is never restarted (:attr:`Restart.NONE`): a death is an
``ActorLost``. Its limits: ``roles.retriever_learner.startup_timeout_s`` for its start, ``run.call_timeout_s`` for a
call.
"""

from __future__ import annotations

from pathlib import Path

import ray
import torch

from bridge_ray.config import Config
from bridge_ray.retriever_learner.learner import (
    AdapterReturns,
    LowerUpdateReturns,
    OwnCandidateReturns,
    RetrieverLearner,
    RetrieverUpdateReturns,
)
from bridge_ray.runtime.actor_group import ActorGroup, Call, Collected, NamedActors, Restart, RoleSpec

ROLE = "retriever_learner"
RESTART = Restart.NONE


class RetrieverLearnerGroup:
    """The retriever learner actor."""

    def __init__(self, group: ActorGroup) -> None:
        self.group = group

    @classmethod
    def start(
        cls, config: Config, spec: RoleSpec, shards: NamedActors, latest: Path | None, version: int
    ) -> RetrieverLearnerGroup:
        """The learner over the shard holders ``shards``, from checkpoint ``latest`` (at retriever ``version``)
        when given, created without waiting for it (:meth:`ready`)."""
        return cls(ActorGroup.start(
            ROLE, RetrieverLearner, spec, RESTART, label="retriever learner", args=(config, shards),
            kwargs={"checkpoint_dir": str(latest) if latest else None, "version": version},
            call_timeout_s=config.run.call_timeout_s,
            startup_timeout_s=config.roles.retriever_learner.startup_timeout_s,
        ))

    def ready(self) -> None:
        """Wait until the query encoder and adapter have loaded, within
        ``roles.retriever_learner.startup_timeout_s``."""
        self.group.ready()

    def adapter(self) -> ray.ObjectRef:
        """Ref to the adapter the learner holds now, once exported (what the samplers must serve)."""
        call = self.group.call(0, RetrieverLearner.adapter, returns=AdapterReturns)
        self.group.collect([call], "adapter")
        return call.out.adapter

    def update(
        self, trajectories: list[ray.ObjectRef], answer_logp: list[ray.ObjectRef], advantages: torch.Tensor
    ) -> Call[RetrieverUpdateReturns]:
        return self.group.call(
            0, RetrieverLearner.update, trajectories, answer_logp, advantages, returns=RetrieverUpdateReturns
        )

    def own_candidates(self, share: int) -> Call[OwnCandidateReturns]:
        return self.group.call(0, RetrieverLearner.own_candidates, share, returns=OwnCandidateReturns)

    def update_lower(self, answer_logp: list[ray.ObjectRef] | None = None) -> Call[LowerUpdateReturns]:
        return self.group.call(0, RetrieverLearner.update_lower, answer_logp, returns=LowerUpdateReturns)

    def collect(self, calls: list[Call], what: str) -> Collected:
        return self.group.collect(calls, what)

    def save(self, directory: str) -> None:
        self.group.collect([self.group.call(0, RetrieverLearner.save, directory)], "save")

    def shutdown(self) -> None:
        self.group.shutdown()
