"""The actor graph's roles: what each asks of the cluster (the ``roles:`` config section), the one check that
the cluster can hold them all, and the start of the samplers and the retriever learner, each an
:class:`ActorGroup` behind its role's typed handle.

``train`` runs :func:`check_graph_resources` once, before the warm-up and before any actor starts (``--dry-run``
stops after it); each group then places its own role when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import ray

from bridge_ray.checkpoint import retriever_adapter_dir
from bridge_ray.config import Config, RoleConfig
from bridge_ray.retrieval.manifest import read_manifest
from bridge_ray.retriever.handle import RetrieverLearnerGroup
from bridge_ray.retriever.learner import RetrieverLearner
from bridge_ray.rollout.handle import SamplerGroup, Serving
from bridge_ray.rollout.sampler import Sampler
from bridge_ray.runtime.actor_group import ActorGroup, NamedActors, Restart, RoleSpec
from bridge_ray.runtime.placement import check_resources


def _spec(role: RoleConfig, count: int | None = None) -> RoleSpec:
    return RoleSpec(count or role.count, role.cpus, role.gpus, role.max_restarts)


def shard_count(config: Config) -> int:
    """Shard holders the run starts: one per shard of ``retrieval.index.dir``'s manifest (``start_shard_holders``),
    else ``retrieval.index.num_shards``, the shards the bundled world's index is built with."""
    index = config.retrieval.index
    return len(read_manifest(index.dir).shards) if index.dir is not None else index.num_shards


def role_specs(config: Config) -> dict[str, RoleSpec]:
    """Every role the run starts, with its count resolved (one shard holder per shard)."""
    roles = config.roles
    specs = {
        "shard_holder": _spec(roles.shard_holder, shard_count(config)),
        "sampler": _spec(roles.sampler),
        "policy_learner": _spec(roles.policy_learner),
    }
    if config.algorithm.train_retriever:
        specs["retriever_learner"] = _spec(roles.retriever_learner)
    return specs


def graph_bundles(config: Config) -> dict[str, list[dict[str, float]]]:
    """The resource bundles of every role of the graph (what ``train --dry-run`` checks against the cluster)."""
    return {role: spec.bundles() for role, spec in role_specs(config).items()}


def check_graph_resources(config: Config, scale_up: bool = True) -> None:
    """Fail fast, before any actor starts, when the cluster cannot hold the whole graph.

    With ``run.autoscale_timeout_s`` (and ``scale_up``) a graph beyond the cluster is first requested
    from the autoscaler and waited for.
    """
    bundles = [b for role in graph_bundles(config).values() for b in role]
    check_resources("training graph", bundles, scale_up_s=config.run.autoscale_timeout_s if scale_up else 0.0)


def start_samplers(
    config: Config,
    shards: NamedActors,
    *,
    model_path: str,
    latest: Path | None,
    retriever_version: int,
    serving: Callable[[], Serving],
) -> SamplerGroup:
    """The samplers, serving the policy at ``model_path`` and the adapter of checkpoint ``latest``; a revived
    sampler is sent what ``serving`` says the run serves now, then its dead call. They find the shard holders by
    name (``shards``): Ray may restart them, and handles in their arguments would make Ray warn about it."""
    adapter = retriever_adapter_dir(latest)
    group = ActorGroup.start(
        "sampler", Sampler, role_specs(config)["sampler"], Restart.RESEND, label="sampler",
        args=(config, shards),
        kwargs={"adapter_dir": str(adapter) if adapter else None, "retriever_version": retriever_version,
                "model": model_path},
        per_actor=lambda i: {"seed": config.run.seed * 1000 + i},
        call_timeout_s=config.run.call_timeout_s, startup_timeout_s=config.learner.startup_timeout_s,
    )
    return SamplerGroup(group, serving)


def start_retriever_learner(
    config: Config, shards: list[ray.actor.ActorHandle], latest: Path | None, version: int
) -> RetrieverLearnerGroup:
    """The retriever learner, from checkpoint ``latest`` (adapter and optimizer) when given."""
    return RetrieverLearnerGroup(ActorGroup.start(
        "retriever_learner", RetrieverLearner, role_specs(config)["retriever_learner"], Restart.NONE,
        label="retriever learner", args=(config, shards),
        kwargs={"checkpoint_dir": str(latest) if latest else None, "version": version},
        call_timeout_s=config.run.call_timeout_s, startup_timeout_s=config.learner.startup_timeout_s,
    ))
