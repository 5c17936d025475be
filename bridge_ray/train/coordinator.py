"""The coordinator: builds the actor graph and runs BRIDGE rounds in the bilevel order (README, "How the pieces fit").

rollout → reward → score → retriever update (every P rounds) → policy update → sync, each phase timed and
tagged with the versions it ran under (``phases.jsonl``). The retriever update of a round always ends
before its policy update starts. In synchronous mode (``rollout.max_staleness: 0``) every sample was drawn
with the current policy and retriever; in asynchronous mode the samplers generate the next round's batch
while the learners run this one, so samples lag by one version, within the bound the round checks.

Faults: a dead sampler is restarted by Ray and its call sent again (:mod:`.sampler_pool`); a dead learner
(a policy rank or the retriever learner) rolls the run back to the last complete checkpoint and the round
is redone. The coordinator runs inside a Ray actor (``bridge_ray.train.coordinator_actor``); it passes refs
between the actors, so rollouts travel to the scorers without passing through it twice.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch

from bridge_ray.agent.types import Trajectory, collate
from bridge_ray.algo.dynamic_sampling import keep_mixed_groups
from bridge_ray.algo.grpo import group_advantages, group_index
from bridge_ray.checkpoint import (
    CheckpointManager,
    Manifest,
    capture_rng_state,
    checkpoint_root,
    load_manifest,
    restore_rng_state,
    seed_rng,
)
from bridge_ray.config import Config, dump_config
from bridge_ray.data.qa import QuestionRecord, load_questions
from bridge_ray.engines.models import load_tokenizer, pad_token_id, resolve_model_path
from bridge_ray.evaluation.table import EvalTable, summarize
from bridge_ray.policy.batch import PolicyBatch
from bridge_ray.policy.learner import PolicyLearnerGroup
from bridge_ray.retrieval.manifest import load_manifest as load_index_manifest
from bridge_ray.retrieval.shard_holder import start_shard_holders
from bridge_ray.retriever.learner import RetrieverLearner
from bridge_ray.retriever.update import ADAPTER_DIR, RetrieverBatch
from bridge_ray.rollout.pool import SamplerCall, SamplerPool, ServingState, split_evenly
from bridge_ray.rollout.sampler import Sampler
from bridge_ray.runtime.calls import ActorLost, get_within
from bridge_ray.runtime.placement import RolePlacement, bundle, check_resources, place_role, release_scale_up
from bridge_ray.telemetry import Telemetry
from bridge_ray.train.cursor import QuestionCursor
from bridge_ray.train.diagnostics import round_diagnostics, zero_signal_warning
from bridge_ray.train.inputs import eval_files, index_dir, train_questions
from bridge_ray.train.phases import (
    POLICY_UPDATE,
    RECOVER,
    RETRIEVER_UPDATE,
    REWARD,
    ROLLOUT,
    SCORE,
    SYNC,
    PhaseRecorder,
)


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


def check_graph_resources(config: Config, scale_up: bool = True) -> None:
    """Fail fast, before any actor starts, when the cluster cannot hold the whole graph.

    With ``run.autoscale_timeout_s`` (and ``scale_up``) a graph beyond the cluster is first requested
    from the autoscaler and waited for.
    """
    bundles = [b for role in graph_bundles(config).values() for b in role]
    check_resources("training graph", bundles, scale_up_s=config.run.autoscale_timeout_s if scale_up else 0.0)


def check_staleness(
    trajectories: Sequence[Trajectory], policy_version: int, retriever_version: int, max_staleness: int = 0
) -> tuple[int, int]:
    """Every sample's policy version, and every search's retriever version, within ``max_staleness`` of now.

    Returns the largest (policy, retriever) lags, the round's staleness figures.
    """

    def lag(uid: str, action: str, model: str, used: int, now: int) -> int:
        if not 0 <= now - used <= max_staleness:
            raise StaleSampleError(
                f"{uid}: {action} with {model} v{used}, learner is at v{now} (rollout.max_staleness={max_staleness})"
            )
        return now - used

    policy_lag = retriever_lag = 0
    for t in trajectories:
        policy_lag = max(policy_lag, lag(t.uid, "generated", "policy", t.policy_version, policy_version))
        for turn in t.retrieval_turns:
            used = turn.retriever_version
            retriever_lag = max(retriever_lag, lag(t.uid, "searched", "retriever", used, retriever_version))
    return policy_lag, retriever_lag


def check_complete_groups(
    trajectories: Sequence[Trajectory], questions: Sequence[QuestionRecord], group_size: int
) -> None:
    """Exactly samples 0..G-1 of every question and nothing else: no trajectory lost or counted twice."""
    expected = {(q.uid, g) for q in questions for g in range(group_size)}
    seen = [(t.uid, t.sample_index) for t in trajectories]
    if len(seen) != len(set(seen)) or set(seen) != expected:
        duplicated = sorted({key for key in seen if seen.count(key) > 1})
        raise RuntimeError(
            f"rollout returned {len(seen)} trajectories for {len(questions)} questions x {group_size}: "
            f"missing {sorted(expected - set(seen))[:5]}, duplicated {duplicated[:5]}, "
            f"unexpected {sorted(set(seen) - expected)[:5]}"
        )


def sample_digest(trajectories: Sequence[Trajectory]) -> str:
    """A fingerprint of a round's sampled tokens: two runs sampled a round alike exactly when their rollout phase
    records carry the same digest (a resumed run and an uninterrupted one, say)."""
    digest = hashlib.sha256()
    for t in sorted(trajectories, key=lambda t: (t.uid, t.sample_index)):
        digest.update(json.dumps([t.uid, t.sample_index, t.token_ids]).encode())
    return digest.hexdigest()[:16]


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


@dataclass
class RoundBatch:
    """A round's questions and the rollout calls generating them (drawn one round ahead in async mode)."""

    # The data cursor and the RNG state before this batch was drawn: what a checkpoint taken before it records.
    cursor_state: dict[str, int]
    rng_state: dict[str, Any]
    questions: list[QuestionRecord]
    seeds: list[int]  # the sampling seed of each sampler's share
    rollouts: list[SamplerCall]
    sent: float  # when the rollouts were sent (before the previous round's learner updates, in async mode)


class Coordinator:
    """Owns the round loop, the data cursor, the versions and the checkpoints of one training run."""

    def __init__(self, config: Config, *, resume: bool = False) -> None:
        self.config = config
        self.run_dir = Path(config.run.output_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(config))
        self.timeout = config.run.call_timeout_s
        self.asynchronous = config.rollout.max_staleness > 0
        self.checkpoints = CheckpointManager(checkpoint_root(config), config.checkpoint.keep)
        latest = self.checkpoints.latest() if resume else None
        if resume and latest is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {checkpoint_root(config)}")
        manifest = load_manifest(latest) if latest is not None else None

        self.train_set = train_questions(config)
        self.eval_sets = {
            name: load_questions([path])[: config.eval.max_questions] for name, path in eval_files(config).items()
        }
        self.model_path = resolve_model_path(config.policy.model)
        self.pad_token_id = pad_token_id(load_tokenizer(self.model_path, config.policy.trust_remote_code))
        self._restore_loop_state(manifest)
        self._ahead: RoundBatch | None = None  # async mode: the next round's batch, being generated
        self._target = config.run.rounds

        check_graph_resources(config)
        self.placements: list[RolePlacement] = []
        self.learner: PolicyLearnerGroup | None = None
        self.retriever_learner = None
        try:
            self._start_actors(config, index_dir(config), latest)
        except BaseException:
            self.shutdown()
            raise
        finally:
            if config.run.autoscale_timeout_s > 0:
                release_scale_up()  # the placement groups now hold the nodes; idle ones may scale down
        self.phases = PhaseRecorder(self.versions, self.run_dir / "phases.jsonl")
        self.telemetry = Telemetry(
            self.run_dir,
            self.run_dir.name,
            config=config.model_dump(),
            wandb_mode=config.telemetry.wandb_mode,
            wandb_project=config.telemetry.wandb_project,
            ray_metrics=config.telemetry.ray_metrics,
        )

    def _restore_loop_state(self, manifest: Manifest | None) -> None:
        """Round counter, data cursor, RNG state and retriever version of ``manifest`` (the start of a run when
        None): together they fix the next round's questions and sampling seeds."""
        cfg = self.config
        self.cursor = QuestionCursor(len(self.train_set), cfg.rollout.questions_drawn, cfg.run.seed)
        if manifest is not None:
            self.cursor.load_state_dict(manifest.data_cursor)
        if manifest is not None and manifest.rng:
            restore_rng_state(manifest.rng)
        else:
            seed_rng(cfg.run.seed)
        self.round = manifest.round if manifest else 0
        self.retriever_version = manifest.retriever_version if manifest else 0

    # ---- graph ---------------------------------------------------------------------------------------

    def _place(self, role: str, bundles: list[dict[str, float]]) -> RolePlacement:
        placement = place_role(role, bundles, self.config.learner.startup_timeout_s)
        self.placements.append(placement)
        return placement

    def _start_actors(self, config: Config, index: Path, latest: Path | None) -> None:
        roles = graph_bundles(config)
        spec = config.retrieval.encoder.spec()
        load_index_manifest(index, spec)  # a wrong index fails here, naming both configurations
        shard_place = self._place("shard_holder", roles["shard_holder"])
        ix, g = config.retrieval.index, config.graph
        self.shards = start_shard_holders(
            index, spec, num_cpus=ix.shard_num_cpus, num_gpus=ix.shard_num_gpus, max_restarts=ix.shard_max_restarts,
            hnsw_ef_search=ix.hnsw_ef_search, ivf_nprobe=ix.ivf_nprobe,
            options=[{"scheduling_strategy": shard_place.strategy(i)} for i in range(ix.num_shards)],
            timeout_s=config.learner.startup_timeout_s,
        )
        self.retriever_placement = (
            self._place("retriever_learner", roles["retriever_learner"]) if config.algorithm.train_retriever else None
        )
        self._start_learners(latest)
        adapter = latest / ADAPTER_DIR if latest is not None and (latest / ADAPTER_DIR).is_dir() else None
        place = self._place("sampler", roles["sampler"])
        handles = [
            ray.remote(Sampler)
            .options(num_cpus=g.sampler_cpus, num_gpus=g.sampler_gpus, scheduling_strategy=place.strategy(i),
                     max_restarts=g.sampler_max_restarts, max_task_retries=0)
            .remote(config, self.shards, seed=config.run.seed * 1000 + i,
                    adapter_dir=str(adapter) if adapter else None, retriever_version=self.retriever_version,
                    model=self.model_path)
            for i in range(g.num_samplers)
        ]
        self.samplers = SamplerPool(
            handles, call_timeout_s=self.timeout, restart_timeout_s=config.learner.startup_timeout_s,
            max_restarts=g.sampler_max_restarts, serving_state=self._serving_state,
        )
        self.samplers.collect(self.samplers.submit_all("versions"), "engine start-up")
        if self.learner.version > 0:
            self._sync_policy()

    def _start_learners(self, latest: Path | None) -> None:
        """The policy learner group and the retriever learner, from ``latest`` when given."""
        config = self.config
        self.learner = PolicyLearnerGroup(config, self.model_path, tokenizer_path=self.model_path)
        if latest is not None:
            self.learner.load(latest)
        if self.retriever_placement is not None:
            g = config.graph
            self.retriever_learner = (
                ray.remote(RetrieverLearner)
                .options(num_cpus=g.retriever_learner_cpus, num_gpus=g.retriever_learner_gpus,
                         scheduling_strategy=self.retriever_placement.strategy(0))
                .remote(config, self.shards, checkpoint_dir=str(latest) if latest else None,
                        version=self.retriever_version)
            )

    def _get(self, refs: Any, what: str) -> Any:
        return get_within(refs, self.timeout, what)

    def versions(self) -> tuple[int, int]:
        """(policy, retriever) versions of the learners: what the samplers must serve after a sync."""
        return (self.learner.version if self.learner else 0), self.retriever_version

    def _serving_state(self) -> ServingState:
        """The policy weights and retriever adapter the samplers should serve now (for a revived sampler)."""
        return (self.learner.weights_for_sync() if self.learner.version > 0 else None), self._current_adapter()

    def _current_adapter(self) -> tuple[ray.ObjectRef, int] | None:
        if self.retriever_learner is None:
            return None
        state, version = self._get(self.retriever_learner.adapter.remote(), "retriever learner (adapter)")
        return ray.put(state), version

    def _sync_policy(self) -> None:
        weights = self.learner.weights_for_sync()
        served = self.samplers.collect(self.samplers.submit_all("update_policy", weights), "policy sync")
        if set(served) != {self.learner.version}:
            raise RuntimeError(f"samplers serve policy versions {served}, expected v{self.learner.version}")

    # ---- the round -----------------------------------------------------------------------------------

    def _draw_batch(self) -> RoundBatch:
        """The next questions from the cursor, their rollouts already sent to the samplers.

        Each sampler's share samples from a seed drawn here, from the RNG state checkpoints keep, so a resumed
        run, a redone round and a share re-sent to a revived sampler all sample from the same seeds.
        """
        cursor, rng = self.cursor.state_dict(), capture_rng_state()
        questions = [self.train_set[i] for i in self.cursor.next_batch()]
        seeds = torch.randint(2**31 - 1, (len(self.samplers),)).tolist()
        group_size = self.config.algorithm.grpo.rollouts_per_question
        calls = [
            self.samplers.submit(i, "rollout", part, group_size, seed)
            for i, (part, seed) in enumerate(zip(split_evenly(questions, len(self.samplers)), seeds, strict=True))
            if part
        ]
        return RoundBatch(cursor, rng, questions, seeds, calls, time.time())

    def run_round(self) -> dict[str, float]:
        cfg, r = self.config, self.round
        grpo, objective = cfg.algorithm.grpo, cfg.algorithm.retriever
        started = time.time()
        batch, self._ahead = self._ahead or self._draw_batch(), None
        self.samplers.revived.clear()
        figures: dict[str, float] = {}

        with self.phases.phase(r, ROLLOUT) as info:
            trajectories = [t for part in self.samplers.collect(batch.rollouts, "rollout") for t in part]
            check_complete_groups(trajectories, batch.questions, grpo.rollouts_per_question)
            policy_lag, retriever_lag = check_staleness(trajectories, *self.versions(), cfg.rollout.max_staleness)
            info["questions"], info["trajectories"] = len(batch.questions), len(trajectories)
            info["question_ids"], info["sampler_seeds"] = [q.uid for q in batch.questions], batch.seeds
            info["sample_digest"] = sample_digest(trajectories)
            info["sent"] = batch.sent
            info["policy_versions"] = sorted({t.policy_version for t in trajectories})
            info["retriever_versions"] = sorted(
                {turn.retriever_version for t in trajectories for turn in t.retrieval_turns}
            )
        figures |= {"staleness/policy": policy_lag, "staleness/retriever": retriever_lag}

        with self.phases.phase(r, REWARD) as info:
            rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
            advantages = group_advantages(rewards, [t.uid for t in trajectories], grpo.adv_eps, grpo.scale_adv_by_std)
            figures |= _diagnose(r, trajectories, batch.questions, info)

        scoring = cfg.algorithm.train_retriever and r % objective.update_period == 0
        scores = [self.samplers.submit(c.index, "score", c.ref) for c in batch.rollouts] if scoring else []
        if self.asynchronous and r + 1 < self._target:
            # Sent after the scoring calls, so each sampler scores first and then generates the next batch
            # while the learners work; the weight pushes below queue behind that generation.
            self._ahead = self._draw_batch()
        adapter_pushes: list[SamplerCall] = []
        if scoring:
            with self.phases.phase(r, SCORE):
                answer_logp = [per_t for part in self.samplers.collect(scores, "answer scoring") for per_t in part]
            with self.phases.phase(r, RETRIEVER_UPDATE) as info:
                update = retriever_batch(trajectories, answer_logp, advantages)
                info["turns"] = len(update)
                if len(update):
                    stats, adapter, version = self._get(
                        self.retriever_learner.update.remote(update), "retriever learner (update)"
                    )
                    self.retriever_version = version
                    adapter_pushes = self.samplers.submit_all("set_retriever_adapter", ray.put(adapter), version)
                    if not self.asynchronous:  # otherwise they queue behind the next batch's generation
                        self.samplers.collect(adapter_pushes, "retriever adapter sync")
                        adapter_pushes = []
                    figures |= {f"retriever/{k}": v for k, v in stats.items()}

        with self.phases.phase(r, POLICY_UPDATE) as info:
            rows = self._policy_rows(rewards, trajectories)
            info["groups"] = figures["policy/groups"] = len({trajectories[i].uid for i in rows})
            batch_rows = [trajectories[i] for i in rows]
            metrics = self.learner.train(policy_batch(batch_rows, advantages[rows], self.pad_token_id))
            figures |= {f"policy/{k}": v for k, v in metrics.items()}
        with self.phases.phase(r, SYNC):
            self.samplers.collect(adapter_pushes, "retriever adapter sync")
            self._sync_policy()

        self.phases.check_round(r)
        self.round += 1
        figures |= {f"time/{k}": v for k, v in self.phases.round_seconds(r).items()}
        if self.round % cfg.checkpoint.every_rounds == 0 or self.round == cfg.run.rounds:
            figures["checkpoint_round"] = float(self.save())
        if cfg.eval.every_rounds and self.round % cfg.eval.every_rounds == 0:
            figures |= {f"eval/{k}": v for k, v in _eval_figures(self.evaluate("round")).items()}
        figures["time/round"] = time.time() - started
        figures["throughput/tokens_per_s"] = sum(sum(t.action_mask) for t in trajectories) / figures["time/round"]
        figures |= {"policy_version": self.learner.version, "retriever_version": self.retriever_version,
                    "faults/samplers_revived": len(self.samplers.revived)}
        self.telemetry.log(r, figures)
        return figures

    def _policy_rows(self, rewards: torch.Tensor, trajectories: Sequence[Trajectory]) -> torch.Tensor:
        """The rows the policy trains on: all of them, or with ``rollout.dynamic_sampling`` the first
        ``questions_per_batch`` groups with mixed rewards (all rows when there is none: the update then
        carries no policy-gradient signal, and the round's warning says so)."""
        every = torch.arange(len(trajectories))
        if not self.config.rollout.dynamic_sampling:
            return every
        kept = keep_mixed_groups(rewards, [t.uid for t in trajectories], self.config.rollout.questions_per_batch)
        return kept if kept.numel() else every

    def run(self, rounds: int | None = None) -> int:
        """Run until ``rounds`` (default ``run.rounds``) rounds are complete; returns the round counter.

        A learner that dies (:class:`ActorLost`) sends the run back to its last complete checkpoint, up
        to ``run.max_learner_failures`` times in a row.
        """
        self._target = self.config.run.rounds if rounds is None else rounds
        failures = 0
        while self.round < self._target:
            try:
                self.run_round()
                failures = 0
            except ActorLost as exc:
                failures += 1
                if failures > self.config.run.max_learner_failures:
                    raise
                self._roll_back(exc)
        return self.round

    def _roll_back(self, failure: Exception) -> None:
        """Rebuild both learners from the last complete checkpoint and make the samplers serve it.

        Everything the failed round did is dropped: its retriever and policy updates, its batch and the
        batch drawn ahead. The process group cannot take back a new member, so the whole group is rebuilt.
        """
        latest = self.checkpoints.latest()
        with self.phases.phase(self.round, RECOVER, failure=str(failure)) as info:
            print(f"round {self.round} failed ({failure}); going back to {latest or 'the start'}", flush=True)
            self._ahead = None
            self.learner.shutdown(graceful=False)
            if self.retriever_learner is not None:
                ray.kill(self.retriever_learner, no_restart=True)
            self._restore_loop_state(load_manifest(latest) if latest is not None else None)
            self._start_learners(latest)
            if (adapter := self._current_adapter()) is not None:
                pushes = self.samplers.submit_all("set_retriever_adapter", *adapter)
                self.samplers.collect(pushes, "retriever adapter after a rollback")
            self._sync_policy()  # the checkpoint's weights, checked against the rebuilt learner's version
            info["restored_round"] = self.round

    # ---- checkpoints and evaluation ------------------------------------------------------------------

    def save(self) -> int:
        """Checkpoint the completed rounds: policy (HF + DeepSpeed state), retriever adapter, loop state."""
        # A batch drawn ahead is drawn again by a resumed run: record the state from before it.
        cursor, rng = (
            (self._ahead.cursor_state, self._ahead.rng_state) if self._ahead
            else (self.cursor.state_dict(), capture_rng_state())
        )
        manifest = Manifest(
            round=self.round, policy_version=self.learner.version, retriever_version=self.retriever_version,
            data_cursor=cursor, rng=rng,
        )

        def write(directory: Path) -> None:
            self.learner.save(directory)
            if self.retriever_learner is not None:
                self._get(self.retriever_learner.save.remote(str(directory)), "retriever learner (save)")

        path = self.checkpoints.save(manifest, write, self.config)
        self.telemetry.log_checkpoint(path)
        return self.round

    def evaluate(self, label: str, eval_sets: dict[str, list[QuestionRecord]] | None = None) -> EvalTable:
        """Greedy rollouts of the current policy and retriever on every eval set, spread over the samplers.

        Each table is appended to ``eval.jsonl`` under ``label`` ("before", "round", "after") with the round
        and versions it measured: the run's learning curve in one file.
        """
        per_dataset = {}
        for name, questions in (eval_sets or self.eval_sets).items():
            calls = self.samplers.submit_split("evaluate", questions)
            per_dataset[name] = [o for part in self.samplers.collect(calls, f"evaluation on {name}") for o in part]
        table = summarize(per_dataset)
        policy_version, retriever_version = self.versions()
        _append_line(self.run_dir / "eval.jsonl", {
            "label": label, "round": self.round, "policy_version": policy_version,
            "retriever_version": retriever_version, "time": time.time(), "table": json.loads(table.to_json()),
        })
        return table

    def state(self) -> dict[str, Any]:
        """Round counter, versions and data cursor (what a resumed run must reproduce)."""
        policy_version, retriever_version = self.versions()
        return {"round": self.round, "policy_version": policy_version, "retriever_version": retriever_version,
                "data_cursor": self.cursor.state_dict()}

    def phase_records(self) -> list[dict[str, Any]]:
        return [vars(r) for r in self.phases.records]

    def shutdown(self) -> None:
        """End every actor of the graph, then free the placement groups once their actors are gone."""
        if getattr(self, "telemetry", None) is not None:
            self.telemetry.close()
        if self.learner is not None:
            self.learner.shutdown()
            self.learner = None
        if getattr(self, "samplers", None) is not None:
            self.samplers.kill()
        for actor in getattr(self, "shards", []):
            ray.kill(actor, no_restart=True)
        self.shards = []
        if self.retriever_learner is not None:
            ray.kill(self.retriever_learner, no_restart=True)
            self.retriever_learner = None
        for placement in self.placements:
            placement.remove()
        self.placements = []


def _diagnose(
    round_index: int, trajectories: Sequence[Trajectory], questions: Sequence[QuestionRecord], info: dict[str, Any]
) -> dict[str, float]:
    """The round's diagnostics, also kept in its reward phase record (``info``), with a warning printed and
    recorded when no GRPO group carries a signal: the rollouts alone say why training stalls."""
    figures = round_diagnostics(trajectories, questions)
    info.update(figures)
    if (warning := zero_signal_warning(figures)) is not None:
        print(f"WARNING [round {round_index}] {warning}", flush=True)
        info["warning"] = warning
    return figures


def _append_line(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line, in one write to a file opened for appending (readers may tail it)."""
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def _eval_figures(table: EvalTable) -> dict[str, float]:
    figures = {f"{row.name}/em": row.em for row in table.rows}
    figures |= {f"{row.name}/recall": row.recall for row in table.rows if row.recall is not None}
    if table.avg is not None:
        figures["avg"] = table.avg
    return figures

