"""The coordinator: builds the actor graph and runs BRIDGE rounds in the bilevel order (ARCHITECTURE.md §2).

rollout → reward → score → retriever update (every P rounds) → policy update → sync, each phase timed and
tagged with the versions it ran under (``phases.jsonl``). The retriever update of a round always ends
before its policy update starts, and in synchronous mode every sample was drawn with the current policy
and retriever. The coordinator runs inside a Ray actor (``bridge_ray.actors.coordinator``); it passes
refs between the actors, so rollouts travel to the scorers without passing through it twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
import torch

from bridge_ray.actors.batch import PolicyBatch
from bridge_ray.actors.placement import RolePlacement, bundle, check_resources, place_role
from bridge_ray.actors.policy_learner import PolicyLearnerGroup
from bridge_ray.actors.retriever_learner import RetrieverLearner
from bridge_ray.actors.sampler import Sampler
from bridge_ray.actors.shard_holder import start_shard_holders
from bridge_ray.agent.types import Trajectory, collate
from bridge_ray.algo.grpo import group_advantages, group_index
from bridge_ray.checkpoint import CheckpointManager, Manifest, capture_rng_state, checkpoint_root, load_manifest
from bridge_ray.config import Config, dump_config
from bridge_ray.data.qa import QuestionRecord, load_questions
from bridge_ray.engines.models import load_tokenizer, resolve_model_path
from bridge_ray.evaluation.table import EvalTable, summarize
from bridge_ray.retrieval.manifest import load_manifest as load_index_manifest
from bridge_ray.telemetry import Telemetry
from bridge_ray.train.cursor import QuestionCursor
from bridge_ray.train.inputs import eval_files, index_dir, train_questions
from bridge_ray.train.phases import POLICY_UPDATE, RETRIEVER_UPDATE, REWARD, ROLLOUT, SCORE, SYNC, PhaseRecorder
from bridge_ray.train.retriever_update import ADAPTER_DIR, RetrieverBatch


class StaleSampleError(RuntimeError):
    """A sample was generated with weights older than the staleness bound allows."""


def graph_bundles(config: Config) -> dict[str, list[dict[str, float]]]:
    """The resource bundles of every role of the graph (what ``train --dry-run`` checks against the cluster)."""
    g, ix, ln = config.graph, config.retrieval.index, config.learner
    roles = {
        "shard_holder": [bundle(ix.shard_num_cpus, ix.shard_num_gpus)] * ix.num_shards,
        "sampler": [bundle(g.sampler_cpus, g.sampler_gpus)] * g.num_samplers,
        "policy_learner": [bundle(ln.cpus_per_rank, ln.gpus_per_rank)] * ln.num_ranks,
    }
    if config.algorithm.train_retriever:
        roles["retriever_learner"] = [bundle(g.retriever_learner_cpus, g.retriever_learner_gpus)]
    return roles


def check_graph_resources(config: Config) -> None:
    """Fail fast, before any actor starts, when the cluster cannot hold the whole graph."""
    check_resources("training graph", [b for bundles in graph_bundles(config).values() for b in bundles])


def check_staleness(
    trajectories: Sequence[Trajectory], policy_version: int, retriever_version: int, max_staleness: int = 0
) -> None:
    """Every sample's policy version, and every search's retriever version, within ``max_staleness`` of now."""
    for t in trajectories:
        lag = policy_version - t.policy_version
        if not 0 <= lag <= max_staleness:
            raise StaleSampleError(
                f"{t.uid}: generated with policy v{t.policy_version}, learner is at v{policy_version}"
            )
        for turn in t.retrieval_turns:
            lag = retriever_version - turn.retriever_version
            if not 0 <= lag <= max_staleness:
                raise StaleSampleError(
                    f"{t.uid}: searched with retriever v{turn.retriever_version}, learner is at v{retriever_version}"
                )


def policy_batch(trajectories: Sequence[Trajectory], advantages: torch.Tensor, pad_token_id: int) -> PolicyBatch:
    """The learner's padded batch: token tensors from the rollouts plus the GRPO advantage of each row."""
    question_index = group_index([t.uid for t in trajectories])
    return PolicyBatch(**collate(trajectories, pad_token_id), advantages=advantages, question_index=question_index)


def retriever_batch(
    trajectories: Sequence[Trajectory], answer_logp: Sequence[Sequence[Sequence[float]]], advantages: torch.Tensor
) -> RetrieverBatch:
    """Every logged retrieval turn, with its trajectory's advantage (eq. app_retrieval_rl_loss's A_i)."""
    rows = [
        (turn, logp, float(advantages[i]))
        for i, t in enumerate(trajectories)
        for turn, logp in zip(t.retrieval_turns, answer_logp[i], strict=True)
    ]
    return RetrieverBatch.from_turns(
        [turn.query for turn, _, _ in rows],
        [turn.doc_ids for turn, _, _ in rows],
        [turn.scores for turn, _, _ in rows],
        [logp for _, logp, _ in rows],
        [adv for _, _, adv in rows],
    )


def split_evenly(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """``parts`` contiguous slices whose sizes differ by at most one (whole questions per sampler)."""
    bounds = [len(items) * p // parts for p in range(parts + 1)]
    return [list(items[a:b]) for a, b in itertools.pairwise(bounds)]


class Coordinator:
    """Owns the round loop, the data cursor, the versions and the checkpoints of one training run."""

    def __init__(self, config: Config, *, resume: bool = False) -> None:
        self.config = config
        self.run_dir = Path(config.run.output_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(config))
        self.timeout = config.run.call_timeout_s
        self.checkpoints = CheckpointManager(checkpoint_root(config), config.checkpoint.keep)
        latest = self.checkpoints.latest() if resume else None
        if resume and latest is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {checkpoint_root(config)}")
        manifest = load_manifest(latest) if latest is not None else None

        self.train_set = train_questions(config)
        self.eval_sets = {
            name: load_questions([path])[: config.eval.max_questions] for name, path in eval_files(config).items()
        }
        self.cursor = QuestionCursor(len(self.train_set), config.rollout.questions_per_batch, config.run.seed)
        model_path = resolve_model_path(config.policy.model)
        self.pad_token_id = _pad_id(load_tokenizer(model_path, config.policy.trust_remote_code))

        check_graph_resources(config)
        self.placements: list[RolePlacement] = []
        self.learner: PolicyLearnerGroup | None = None
        try:
            self._start_actors(config, index_dir(config), model_path, latest, manifest)
        except BaseException:
            self.shutdown()
            raise
        self.round = manifest.round if manifest else 0
        if manifest:
            self.cursor.load_state_dict(manifest.data_cursor)
        self.phases = PhaseRecorder(self.versions, self.run_dir / "phases.jsonl")
        self.telemetry = Telemetry(
            self.run_dir,
            self.run_dir.name,
            config=config.model_dump(),
            wandb_mode=config.telemetry.wandb_mode,
            wandb_project=config.telemetry.wandb_project,
            ray_metrics=config.telemetry.ray_metrics,
        )

    # ---- graph ---------------------------------------------------------------------------------------

    def _place(self, role: str, bundles: list[dict[str, float]]) -> RolePlacement:
        placement = place_role(role, bundles, self.config.learner.startup_timeout_s)
        self.placements.append(placement)
        return placement

    def _start_actors(
        self, config: Config, index: Path, model_path: str, latest: Path | None, manifest: Manifest | None
    ) -> None:
        roles = graph_bundles(config)
        spec = config.retrieval.encoder.spec()
        load_index_manifest(index, spec)  # a wrong index fails here, naming both configurations
        shard_place = self._place("shard_holder", roles["shard_holder"])
        ix = config.retrieval.index
        self.shards = start_shard_holders(
            index, spec, num_cpus=ix.shard_num_cpus, num_gpus=ix.shard_num_gpus, max_restarts=ix.shard_max_restarts,
            hnsw_ef_search=ix.hnsw_ef_search, ivf_nprobe=ix.ivf_nprobe,
            options=[{"scheduling_strategy": shard_place.strategy(i)} for i in range(ix.num_shards)],
        )
        self.learner = PolicyLearnerGroup(config, model_path, tokenizer_path=model_path)
        if latest is not None:
            self.learner.load(latest)
        self.retriever_version = manifest.retriever_version if manifest else 0
        adapter = latest / ADAPTER_DIR if latest is not None and (latest / ADAPTER_DIR).is_dir() else None
        self.retriever_learner = None
        g = config.graph
        if config.algorithm.train_retriever:
            place = self._place("retriever_learner", roles["retriever_learner"])
            self.retriever_learner = (
                ray.remote(RetrieverLearner)
                .options(num_cpus=g.retriever_learner_cpus, num_gpus=g.retriever_learner_gpus,
                         scheduling_strategy=place.strategy(0))
                .remote(config, self.shards, checkpoint_dir=str(latest) if latest else None,
                        version=self.retriever_version)
            )
        place = self._place("sampler", roles["sampler"])
        self.samplers = [
            ray.remote(Sampler)
            .options(num_cpus=g.sampler_cpus, num_gpus=g.sampler_gpus, scheduling_strategy=place.strategy(i))
            .remote(config, self.shards, seed=config.run.seed * 1000 + i,
                    adapter_dir=str(adapter) if adapter else None, retriever_version=self.retriever_version,
                    model=model_path)
            for i in range(g.num_samplers)
        ]
        self._get([s.versions.remote() for s in self.samplers], "samplers (engine start-up)")
        if self.learner.version > 0:
            self._sync_policy()

    def _get(self, refs: Any, what: str) -> Any:
        """``ray.get`` with the run's call timeout; a hang becomes an error naming the actors."""
        try:
            return ray.get(refs, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"{what} did not answer within run.call_timeout_s={self.timeout:g}s") from None

    def versions(self) -> tuple[int, int]:
        """(policy, retriever) versions of the learners: what the samplers must serve after a sync."""
        return (self.learner.version if self.learner else 0), self.retriever_version

    def _sync_policy(self) -> None:
        weights = self.learner.weights_for_sync()
        served = self._get([s.update_policy.remote(weights) for s in self.samplers], "samplers (policy sync)")
        if set(served) != {self.learner.version}:
            raise RuntimeError(f"samplers serve policy versions {served}, expected v{self.learner.version}")

    # ---- the round -----------------------------------------------------------------------------------

    def run_round(self) -> dict[str, float]:
        cfg, r = self.config, self.round
        grpo, objective = cfg.algorithm.grpo, cfg.algorithm.retriever
        questions = [self.train_set[i] for i in self.cursor.next_batch()]
        figures: dict[str, float] = {}

        with self.phases.phase(r, ROLLOUT) as info:
            parts = split_evenly(questions, len(self.samplers))
            busy = [(s, part) for s, part in zip(self.samplers, parts, strict=True) if part]
            rollout_refs = [s.rollout.remote(part, grpo.rollouts_per_question) for s, part in busy]
            per_sampler = self._get(rollout_refs, "samplers (rollout)")
            trajectories = [t for part in per_sampler for t in part]
            check_staleness(trajectories, *self.versions())
            info["trajectories"] = len(trajectories)
            info["policy_versions"] = sorted({t.policy_version for t in trajectories})
            info["retriever_versions"] = sorted(
                {turn.retriever_version for t in trajectories for turn in t.retrieval_turns}
            )

        with self.phases.phase(r, REWARD):
            rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
            advantages = group_advantages(rewards, [t.uid for t in trajectories], grpo.adv_eps, grpo.scale_adv_by_std)
        figures |= _rollout_figures(trajectories)

        if cfg.algorithm.train_retriever and r % objective.update_period == 0:
            with self.phases.phase(r, SCORE):
                score_refs = [s.score.remote(ref) for (s, _), ref in zip(busy, rollout_refs, strict=True)]
                answer_logp = [per_t for part in self._get(score_refs, "samplers (answer scoring)") for per_t in part]
            with self.phases.phase(r, RETRIEVER_UPDATE) as info:
                batch = retriever_batch(trajectories, answer_logp, advantages)
                info["turns"] = len(batch)
                if len(batch):
                    stats, adapter, version = self._get(
                        self.retriever_learner.update.remote(batch), "retriever learner (update)"
                    )
                    adapter_ref = ray.put(adapter)
                    self._get([s.set_retriever_adapter.remote(adapter_ref, version) for s in self.samplers],
                              "samplers (retriever adapter sync)")
                    self.retriever_version = version
                    figures |= {f"retriever/{k}": v for k, v in stats.items()}

        with self.phases.phase(r, POLICY_UPDATE):
            metrics = self.learner.train(policy_batch(trajectories, advantages, self.pad_token_id))
            figures |= {f"policy/{k}": v for k, v in metrics.items()}
        with self.phases.phase(r, SYNC):
            self._sync_policy()

        self.round += 1
        figures |= {f"time/{k}": v for k, v in self.phases.round_seconds(r).items()}
        if self.round % cfg.checkpoint.every_rounds == 0 or self.round == cfg.run.rounds:
            figures["checkpoint_round"] = float(self.save())
        if cfg.eval.every_rounds and self.round % cfg.eval.every_rounds == 0:
            figures |= {f"eval/{k}": v for k, v in _eval_figures(self.evaluate()).items()}
        self.telemetry.log(r, figures)
        return figures

    def run(self, rounds: int | None = None) -> int:
        """Run until ``rounds`` (default ``run.rounds``) rounds are complete; returns the round counter."""
        target = self.config.run.rounds if rounds is None else rounds
        while self.round < target:
            self.run_round()
        return self.round

    # ---- checkpoints and evaluation ------------------------------------------------------------------

    def save(self) -> int:
        """Checkpoint the completed rounds: policy (HF + DeepSpeed state), retriever adapter, loop state."""
        manifest = Manifest(
            round=self.round, policy_version=self.learner.version, retriever_version=self.retriever_version,
            data_cursor=self.cursor.state_dict(), rng=capture_rng_state(),
        )

        def write(directory: Path) -> None:
            self.learner.save(directory)
            if self.retriever_learner is not None:
                self._get(self.retriever_learner.save.remote(str(directory)), "retriever learner (save)")

        self.checkpoints.save(manifest, write, self.config)
        return self.round

    def evaluate(self, eval_sets: dict[str, list[QuestionRecord]] | None = None) -> EvalTable:
        """Greedy rollouts of the current policy and retriever on every eval set, spread over the samplers."""
        per_dataset = {}
        for name, questions in (eval_sets or self.eval_sets).items():
            parts = [p for p in split_evenly(questions, len(self.samplers)) if p]
            refs = [s.evaluate.remote(p) for s, p in zip(self.samplers, parts, strict=False)]
            per_dataset[name] = [o for part in self._get(refs, f"samplers (evaluation on {name})") for o in part]
        return summarize(per_dataset)

    def state(self) -> dict[str, Any]:
        """Round counter, versions and data cursor (what a resumed run must reproduce)."""
        policy_version, retriever_version = self.versions()
        return {"round": self.round, "policy_version": policy_version, "retriever_version": retriever_version,
                "data_cursor": self.cursor.state_dict()}

    def phase_records(self) -> list[dict[str, Any]]:
        return [vars(r) for r in self.phases.records]

    def shutdown(self) -> None:
        if getattr(self, "telemetry", None) is not None:
            self.telemetry.close()
        if self.learner is not None:
            self.learner.shutdown()
            self.learner = None
        for name in ("samplers", "shards"):
            for actor in getattr(self, name, []):
                ray.kill(actor)
        if getattr(self, "retriever_learner", None) is not None:
            ray.kill(self.retriever_learner)
        for placement in self.placements:
            placement.remove()
        self.placements = []


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _rollout_figures(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    n = max(len(trajectories), 1)
    searches = sum(len(t.retrieval_turns) for t in trajectories)
    return {
        "reward": sum(t.reward for t in trajectories) / n,
        "answered": sum(t.finished for t in trajectories) / n,
        "searches_per_trajectory": searches / n,
        "response_tokens": sum(t.response_length for t in trajectories) / n,
    }


def _eval_figures(table: EvalTable) -> dict[str, float]:
    figures = {f"{row.name}/em": row.em for row in table.rows}
    figures |= {f"{row.name}/recall": row.recall for row in table.rows if row.recall is not None}
    if table.avg is not None:
        figures["avg"] = table.avg
    return figures

