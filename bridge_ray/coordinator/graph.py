"""The actor graph: what each role asks of the cluster (the ``roles:`` config section), the one check that the
cluster can hold them all, and :class:`Graph`, which starts, health-checks and stops the four roles of a run.

``train`` runs :func:`check_graph_resources` once, before the warm-up and before any actor starts (``--dry-run``
stops after it). :meth:`Graph.start` then places and starts the shard holders, the learners and the samplers, each
an :class:`ActorGroup` behind its role's typed handle (the ``handle`` module of its package, which reads the role's
limits from the config), and waits until each is up within its own start-up timeout
(``roles.<role>.startup_timeout_s``): this module is the one place that knows where the roles go. The graph also
knows what the samplers serve (:meth:`Graph.serving`, what a revived sampler is sent) and confirms the syncs that
change it (:meth:`Graph.confirm`); the coordinator drives the rounds over it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import ray
from huggingface_hub import snapshot_download

from bridge_ray.checkpoint import POLICY_DIR, load_manifest, retriever_adapter_dir
from bridge_ray.config import Config, RoleConfig
from bridge_ray.coordinator.inputs import index_dir
from bridge_ray.errors import InputError
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.policy_learner.handle import PolicyLearnerGroup
from bridge_ray.retrieval.manifest import read_manifest
from bridge_ray.retriever_learner.handle import RetrieverLearnerGroup
from bridge_ray.runtime.actor_group import Call, RoleSpec
from bridge_ray.runtime.placement import PlacementError, release_scale_up, require_capacity, shortfall
from bridge_ray.sampler.handle import SamplerGroup, Serving
from bridge_ray.shard_holder.group import start_shard_holders
from bridge_ray.shard_holder.handle import ShardHolders


def _spec(role: RoleConfig, count: int | None = None) -> RoleSpec:
    return RoleSpec(count or role.count, role.cpus, role.gpus, role.max_restarts, role.resources)


def shard_count(config: Config) -> int:
    """Shard holders the run starts: one per shard of ``retrieval.index.dir``'s manifest (``start_shard_holders``),
    else ``retrieval.index.num_shards``, the shards the bundled world's index is built with. A set
    ``roles.shard_holder.count`` must equal it."""
    index, count = config.retrieval.index, config.roles.shard_holder.count
    if index.dir is None:
        return index.num_shards  # the config's validation compared count with num_shards
    shards = len(read_manifest(index.dir).shards)
    if count is not None and count != shards:
        raise InputError(f"roles.shard_holder.count ({count}) must equal the shards of retrieval.index.dir "
                         f"{index.dir} ({shards}): each holder serves one shard (null: one per shard)")
    return shards


def role_specs(config: Config) -> dict[str, RoleSpec]:
    """Every role the run starts, with its count resolved (one shard holder per shard); a learner only when what
    it trains does (a frozen policy reserves no GPUs for its learner)."""
    roles = config.roles
    specs = {
        "shard_holder": _spec(roles.shard_holder, shard_count(config)),
        "sampler": _spec(roles.sampler),
    }
    if config.algorithm.train_policy:
        specs["policy_learner"] = _spec(roles.policy_learner)
    if config.algorithm.train_retriever:
        specs["retriever_learner"] = _spec(roles.retriever_learner)
    return specs


def graph_bundles(config: Config) -> dict[str, list[dict[str, float]]]:
    """The resource bundles of every role of the graph (what ``train --dry-run`` checks against the cluster)."""
    return {role: spec.bundles() for role, spec in role_specs(config).items()}


def check_graph_resources(config: Config, scale_up: bool = True) -> None:
    """Fail fast, before any actor starts, when the cluster cannot hold the whole graph.

    With ``run.autoscale_timeout_s`` (and ``scale_up``) a graph beyond the cluster is first requested
    from the autoscaler and waited for, after one line naming each role that does not fit yet and what it lacks.
    """
    by_role = graph_bundles(config)
    scale_up_s = config.run.autoscale_timeout_s if scale_up else 0.0
    if scale_up_s > 0 and (waiting := [p for role, b in by_role.items() if (p := shortfall(role, b)[0])]):
        print(f"waiting up to {scale_up_s:g}s (run.autoscale_timeout_s) for nodes: {'; '.join(waiting)}", flush=True)
    try:
        require_capacity("training graph", [b for role in by_role.values() for b in role], scale_up_s=scale_up_s)
    except PlacementError:
        if scale_up_s > 0:
            release_scale_up()  # the run ends here: withdraw its request, so the autoscaler adds nothing for it
        raise


def start_policy_learner(
    config: Config, model_path: str | Path, tokenizer_path: str | Path | None = None
) -> PolicyLearnerGroup:
    """The policy learner ranks, placed as ``roles.policy_learner`` says and starting; their
    :meth:`~PolicyLearnerGroup.ready` waits for them within their start-up limit."""
    return PolicyLearnerGroup(
        config, model_path, spec=_spec(config.roles.policy_learner), tokenizer_path=tokenizer_path
    )


@dataclass(frozen=True)
class Sync:
    """What one sync sent every sampler: the new retriever adapter and the new policy weights (either list may be
    empty), and the policy version those weights carry. :meth:`Graph.confirm` waits for it."""

    adapter: list[Call]
    weights: list[Call]
    policy_version: int


class Graph:
    """The four roles of one training run: shard holders, policy learner, retriever learner and samplers.

    Only the roles that train start: with ``algorithm.train_policy: false`` there is no policy learner (its GPUs
    are not reserved, and its checkpoints hold a copy of the policy the samplers serve), with
    ``train_retriever: false`` no retriever learner. :meth:`start` starts them on Ray; a graph built directly
    holds no role yet (the coordinator's unit test fills one with fakes). A learner's death is its owner's to
    handle: :meth:`restart_learners` rebuilds the learners from a checkpoint, while samplers and shard holders are
    restarted by Ray under their restart policy.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.model_path = resolve_model_path(config.policy.model)
        self.shards: ShardHolders | None = None
        self.learner: PolicyLearnerGroup | None = None
        self.retriever_learner: RetrieverLearnerGroup | None = None
        self.samplers: SamplerGroup | None = None
        self.adapter: ray.ObjectRef | None = None  # the retriever adapter the samplers serve, once exported

    @classmethod
    def start(cls, config: Config, latest: Path | None) -> Graph:
        """Every role of ``config``'s graph, from checkpoint ``latest`` when given, each waited for within its
        start-up timeout; the samplers serve what the learners hold. A role that fails to start stops the others."""
        graph = cls(config)
        try:
            graph.shards = graph._start_shard_holders()
            # The learners and samplers load their models side by side, then are waited for.
            graph._launch_learners(latest)
            graph.samplers = graph._launch_samplers(latest)
            graph._learners_ready(latest)
            graph.samplers.ready()  # every engine has loaded
            if graph.policy_version > 0:  # resumed: the samplers serve the checkpoint's weights, not policy.model's
                graph.confirm(graph.send_sync([]))
        except BaseException:
            graph.shutdown()
            raise
        finally:
            if config.run.autoscale_timeout_s > 0:
                release_scale_up()  # the placement groups now hold the nodes; idle ones may scale down
        return graph

    def _start_shard_holders(self) -> ShardHolders:
        """One holder per shard of the run's index, each waited for until its shard has loaded (a wrong or damaged
        index fails before any actor starts, naming both configurations)."""
        holders, index = self.config.roles.shard_holder, self.config.retrieval.index
        return start_shard_holders(
            index_dir(self.config), self.config.retrieval.encoder.spec(), num_cpus=holders.cpus,
            num_gpus=holders.gpus, resources=holders.resources, max_restarts=holders.max_restarts,
            timeout_s=holders.startup_timeout_s,
            **index.search_options(),
        )

    def start_learners(self, latest: Path | None) -> None:
        """The policy learner ranks and the retriever learner (those that train), from checkpoint ``latest`` when
        given, waited for."""
        self._launch_learners(latest)
        self._learners_ready(latest)

    def _launch_learners(self, latest: Path | None) -> None:
        """Create the learners that train, without waiting for them (:meth:`_learners_ready`)."""
        config = self.config
        self.adapter = None
        if config.algorithm.train_policy:
            self.learner = start_policy_learner(config, self.model_path, tokenizer_path=self.model_path)
        if config.algorithm.train_retriever:
            self.retriever_learner = RetrieverLearnerGroup.start(
                config, role_specs(config)["retriever_learner"], self.shards.named(), latest,
                _retriever_version(latest),
            )

    def _learners_ready(self, latest: Path | None) -> None:
        """Wait for the learners :meth:`_launch_learners` created, each within its start-up timeout; the policy
        learner then loads checkpoint ``latest`` when given."""
        if self.learner is not None:
            self.learner.ready()
            if latest is not None:
                self.learner.load(latest)
        if self.retriever_learner is not None:
            self.retriever_learner.ready()

    def _launch_samplers(self, latest: Path | None) -> SamplerGroup:
        """The samplers, serving the policy at ``model_path`` and the adapter of checkpoint ``latest``, created
        without waiting for their engines to load; a revived sampler is sent what :meth:`serving` says the run
        serves now, then its dead call."""
        adapter = retriever_adapter_dir(latest)
        return SamplerGroup.start(
            self.config, role_specs(self.config)["sampler"], self.shards.named(), self.serving,
            adapter_dir=str(adapter) if adapter else None, retriever_version=_retriever_version(latest),
            model=self.model_path,
        )

    def restart_learners(self, latest: Path | None) -> None:
        """After a learner died: rebuild the learners from checkpoint ``latest`` (None: the run's start) and make
        every sampler serve what they hold. The process group cannot take back a new member, so the whole policy
        group is rebuilt; its survivors may be stuck in a collective and are ended without a goodbye."""
        if self.learner is not None:
            self.learner.shutdown(graceful=False)
        if self.retriever_learner is not None:
            self.retriever_learner.shutdown()
        self._await_learner_nodes()
        self.start_learners(latest)
        adapter = self.current_adapter()
        adapter_pushes = self.samplers.set_adapter(adapter) if adapter is not None else []
        self.confirm(self.send_sync(adapter_pushes))

    def _await_learner_nodes(self) -> None:
        """A learner that died with its node leaves no room for its rebuild until a node replaces it: wait for one
        up to ``run.autoscale_timeout_s``, asking the autoscaler, as :func:`check_graph_resources` does at the
        run's start (0: the rebuild fails at once, naming what is missing)."""
        scale_up_s = self.config.run.autoscale_timeout_s
        if scale_up_s <= 0:
            return
        roles = self.config.roles  # the learners alone: sizing the shard holders would read the index's manifest
        bundles = [
            *(_spec(roles.policy_learner).bundles() if self.config.algorithm.train_policy else []),
            *(_spec(roles.retriever_learner).bundles() if self.config.algorithm.train_retriever else []),
        ]
        if not bundles:
            return
        if missing := shortfall("learners", bundles)[0]:
            print(f"waiting up to {scale_up_s:g}s (run.autoscale_timeout_s) for nodes: {missing}", flush=True)
        try:
            require_capacity("learners", bundles, scale_up_s=scale_up_s)
        finally:
            release_scale_up()

    @property
    def policy_version(self) -> int:
        """The policy learner's version (0 for a frozen policy, which has none)."""
        return self.learner.version if self.learner is not None else 0

    def current_adapter(self) -> ray.ObjectRef | None:
        """Ref to the retriever adapter the samplers serve (exported by the learner after its start), if any."""
        if self.retriever_learner is not None and self.adapter is None:
            self.adapter = self.retriever_learner.adapter()
        return self.adapter

    def serving(self) -> Serving:
        """The run's current adapter and policy weights: what a revived sampler is sent."""
        weights = self.learner.weights_for_sync() if self.policy_version > 0 else None
        return Serving(self.current_adapter(), weights)

    def send_sync(self, adapter_pushes: list[Call]) -> Sync:
        """Send every sampler the policy learner's weights (behind ``adapter_pushes``, already sent); a frozen
        policy's are the ones the samplers already serve."""
        weights = self.samplers.update_policy(self.learner.weights_for_sync()) if self.learner is not None else []
        return Sync(adapter_pushes, weights, self.policy_version)

    def confirm(self, sync: Sync) -> None:
        """Wait until every sampler serves what ``sync`` sent, its policy version checked."""
        self.samplers.collect(sync.adapter, "retriever adapter sync")
        served = self.samplers.collect(sync.weights, "policy sync").values
        if served and set(served) != {sync.policy_version}:
            raise RuntimeError(f"samplers serve policy versions {served}, expected v{sync.policy_version}")

    def save(self, directory: Path) -> None:
        """The learners' state into checkpoint ``directory``: the policy learner's (HF policy, adapter, DeepSpeed
        state), or for a frozen policy a copy of the policy the samplers serve; the retriever learner's adapter and
        optimizer."""
        if self.learner is not None:
            self.learner.save(directory)
        else:
            copy_policy(self.model_path, directory / POLICY_DIR)
        if self.retriever_learner is not None:
            self.retriever_learner.save(str(directory))

    def shutdown(self) -> None:
        """End every actor of the graph; each group frees its placement group once its actors are gone."""
        if self.learner is not None:
            self.learner.shutdown()
        for group in (self.samplers, self.shards, self.retriever_learner):
            if group is not None:
                group.shutdown()
        self.learner = self.samplers = self.shards = self.retriever_learner = None


def copy_policy(model: str, target: Path) -> None:
    """The HF policy ``model`` (a directory, or a hub name in the local cache) as files under ``target``: linked
    where the filesystem allows (a frozen policy's every checkpoint holds the same files), else copied."""
    source = Path(model) if Path(model).is_dir() else Path(snapshot_download(model))
    shutil.copytree(source, target, copy_function=_link_or_copy)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(source, target)


def _retriever_version(latest: Path | None) -> int:
    """The retriever version checkpoint ``latest`` holds (0 at a run's start)."""
    return load_manifest(latest).retriever_version if latest is not None else 0
