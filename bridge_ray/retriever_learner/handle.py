"""The retriever learner as the coordinator calls it: a typed handle over its one-actor :class:`ActorGroup`.

Its calls return frozen bundles of named refs: the coordinator waits on the first (figures, versions), and
hands the others (the new adapter, η*'s own candidates, the
:class:`~bridge_ray.retriever_learner.learner.RetrievalRows`) by reference to the samplers and the policy ranks.
It is never restarted (:attr:`Restart.NONE`): a death is an ``ActorLost``.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
import torch

from bridge_ray.retriever_learner.learner import RetrieverLearner
from bridge_ray.runtime.actor_group import ActorGroup, Call, Collected

ROLE = "retriever_learner"


@dataclass(frozen=True)
class AdapterRefs:
    """:meth:`RetrieverLearner.adapter`'s returns: its version, and the adapter the samplers load."""

    version: ray.ObjectRef
    adapter: ray.ObjectRef


@dataclass(frozen=True)
class RetrieverUpdateRefs:
    """:meth:`RetrieverLearner.update`'s returns: (figures, new version), the new adapter, and with Drop and
    two-state the updated η_γ's ``RetrievalRows`` for the policy ranks (None for BRIDGE)."""

    stats: ray.ObjectRef
    adapter: ray.ObjectRef
    rows: ray.ObjectRef


@dataclass(frozen=True)
class OwnCandidateRefs:
    """:meth:`RetrieverLearner.own_candidates`' returns: the retrieval turns of one share, and that share's
    trajectories with η*'s own candidates, which its sampler scores."""

    turns: ray.ObjectRef
    trajectories: ray.ObjectRef


@dataclass(frozen=True)
class LowerUpdateRefs:
    """:meth:`RetrieverLearner.update_lower`'s returns: η*'s figures, and its ``RetrievalRows``."""

    stats: ray.ObjectRef
    rows: ray.ObjectRef


class RetrieverLearnerGroup:
    """The retriever learner actor."""

    def __init__(self, group: ActorGroup) -> None:
        self.group = group

    def adapter(self) -> ray.ObjectRef:
        """Ref to the adapter the learner holds now, once exported (what the samplers must serve)."""
        call = self.group.call(0, RetrieverLearner.adapter, returns=AdapterRefs)
        self.group.collect([call], "adapter")
        return call.out.adapter

    def update(
        self, trajectories: list[ray.ObjectRef], answer_logp: list[ray.ObjectRef], advantages: torch.Tensor
    ) -> Call[RetrieverUpdateRefs]:
        return self.group.call(
            0, RetrieverLearner.update, trajectories, answer_logp, advantages, returns=RetrieverUpdateRefs
        )

    def own_candidates(self, share: int) -> Call[OwnCandidateRefs]:
        return self.group.call(0, RetrieverLearner.own_candidates, share, returns=OwnCandidateRefs)

    def update_lower(self, answer_logp: list[ray.ObjectRef] | None = None) -> Call[LowerUpdateRefs]:
        return self.group.call(0, RetrieverLearner.update_lower, answer_logp, returns=LowerUpdateRefs)

    def collect(self, calls: list[Call], what: str) -> Collected:
        return self.group.collect(calls, what)

    def save(self, directory: str) -> None:
        self.group.collect([self.group.call(0, RetrieverLearner.save, directory)], "save")

    def shutdown(self) -> None:
        self.group.shutdown()
