"""The policy learner ranks as the coordinator calls them: a typed handle over their :class:`ActorGroup`.

The ranks are one group under :attr:`Restart.NONE` (a rank cannot rejoin a live process group): a death is an
``ActorLost`` for the owner, which rebuilds the whole group from the last checkpoint. Each call sends a
:class:`PolicyLearnerRank` method itself to every rank; the weight export's two returns are read by the names of
:class:`~bridge_ray.policy_learner.learner.ExportReturns`. Its limits: ``roles.policy_learner.startup_timeout_s``
for the model load and the process group, ``run.call_timeout_s`` for a call.
"""

from __future__ import annotations

from pathlib import Path

import ray
import torch

from bridge_ray.config import Config
from bridge_ray.policy_learner.batch import PolicyBatch
from bridge_ray.policy_learner.learner import (
    STEP_TOTALS,
    ExportReturns,
    PolicyLearnerRank,
    PolicyRows,
    RagTerms,
    merge_ranks,
)
from bridge_ray.runtime.actor_group import ActorGroup, Restart, RoleSpec
from bridge_ray.runtime.placement import PlacementError

ROLE = "policy_learner"
RESTART = Restart.NONE
# How long a graceful shutdown waits for the ranks to leave their process group before they are killed anyway.
LEAVE_TIMEOUT_S = 30.0


class PolicyLearnerGroup:
    """The policy learner ranks as one object (the role's typed handle): train, export weights, save and load.

    The ranks do not restart on failure (a member cannot rejoin a live process group): the owner
    rebuilds the whole group and loads the last checkpoint into it (:meth:`load`). The training graph
    (:class:`bridge_ray.coordinator.graph.Graph`) says where they go (``spec``); they may take
    ``roles.policy_learner.startup_timeout_s`` to start.
    """

    def __init__(
        self, config: Config, model_path: str | Path, *, spec: RoleSpec, tokenizer_path: str | Path | None = None,
    ) -> None:
        self.config = config
        self.tokenizer_path = None if tokenizer_path is None else str(tokenizer_path)
        self.version = 0
        self.startup_timeout_s = config.roles.policy_learner.startup_timeout_s
        self.ranks = ActorGroup.start(
            ROLE, PolicyLearnerRank, spec, RESTART, label="policy learner ranks", args=(config, str(model_path)),
            per_actor=lambda rank: {"rank": rank, "world_size": spec.count},
            call_timeout_s=config.run.call_timeout_s, startup_timeout_s=self.startup_timeout_s,
        )
        try:  # rank 0's address goes to every rank's setup as a ref: nothing here waits for it
            address = self.ranks.call(0, PolicyLearnerRank.rendezvous)
            self._setup = self.ranks.call_all(PolicyLearnerRank.setup, address.result)
        except BaseException:
            self.shutdown()
            raise

    def ready(self) -> PolicyLearnerGroup:
        """Wait until every rank has loaded the model and joined the process group, within
        ``roles.policy_learner.startup_timeout_s``; the constructor only sent that work, so that the graph's other
        roles start meanwhile."""
        startup, count = self.startup_timeout_s, len(self.ranks)
        try:
            self.ranks.collect(self._setup, "setup", startup)
        except TimeoutError:
            self.shutdown()
            raise PlacementError(
                f"role {ROLE!r}: {count} rank(s) did not load the model and form their process group "
                f"within roles.{ROLE}.startup_timeout_s={startup:g}s"
            ) from None
        except BaseException:
            self.shutdown()
            raise
        return self

    def train(self, batch: PolicyBatch) -> dict[str, float]:
        """One policy update on a round's batch; its metrics as :meth:`_update` merges them."""
        return self._update(ray.put(batch))

    def train_on(
        self, trajectories: list[ray.ObjectRef], rows: list[int], advantages: torch.Tensor,
        rag: RagTerms | None = None,
    ) -> dict[str, float]:
        """One policy update on rows ``rows`` of the trajectories behind ``trajectories`` (see :class:`PolicyRows`),
        with the estimator's L_RAG terms when ``rag`` is given."""
        if not rows:
            raise ValueError("the policy learner got no rows to train on")
        return self._update(PolicyRows(trajectories, rows, advantages), rag)

    def _update(self, source: ray.ObjectRef | PolicyRows, rag: RagTerms | None = None) -> dict[str, float]:
        """Metrics are means over the update's optimizer steps, but for :data:`STEP_TOTALS` (totals over
        steps and ranks)."""
        per_rank = self.ranks.collect(self.ranks.call_all(PolicyLearnerRank.train_on, source, rag), "train").values
        self.version += 1
        steps = [merge_ranks(step) for step in zip(*per_rank, strict=True)]
        totals = {key: sum(step[key] for step in steps) for key in steps[0]}
        metrics = {key: total if key in STEP_TOTALS else total / len(steps) for key, total in totals.items()}
        return {**metrics, "optimizer_steps": float(len(steps)), "policy_version": float(self.version)}

    def weights_for_sync(self) -> ray.ObjectRef:
        """Ref to :class:`PolicyWeights` (full weights, or the adapter with LoRA) tagged with the version; the
        weights stay in the object store (the other ranks only take part in the gather)."""
        calls = self.ranks.call_all(PolicyLearnerRank.export, returns=ExportReturns)
        versions = set(self.ranks.collect(calls, "weight export").values)
        if versions != {self.version}:
            raise RuntimeError(f"policy learner ranks export versions {sorted(versions)}, expected v{self.version}")
        return calls[0].out.weights

    def save(self, directory: str | Path) -> None:
        """Write ``policy/`` (HF safetensors), ``policy_adapter/`` (LoRA) and ``policy_state/`` into ``directory``.

        ``directory`` must be reachable from every rank's node (shared storage on a multi-node cluster).
        """
        self.ranks.collect(self.ranks.call_all(PolicyLearnerRank.save, str(directory), self.tokenizer_path), "save")

    def load(self, directory: str | Path) -> None:
        """Resume from :meth:`save`'s output; call before the first :meth:`train`."""
        versions = set(self.ranks.collect(self.ranks.call_all(PolicyLearnerRank.load, str(directory)), "load").values)
        if len(versions) != 1:
            raise RuntimeError(f"policy learner ranks restored different versions {sorted(versions)} from {directory}")
        self.version = versions.pop()

    def shutdown(self, graceful: bool = True) -> None:
        """Leave the process group, end the rank actors and free their placement group.

        ``graceful=False`` after a rank died: the survivors may be stuck in a collective, so they are
        killed without being asked to leave the group.
        """
        if self.ranks.handles and graceful:
            calls = self.ranks.call_all(PolicyLearnerRank.shutdown)
            ray.wait([c.result for c in calls], num_returns=len(self.ranks), timeout=LEAVE_TIMEOUT_S)
        self.ranks.shutdown()
