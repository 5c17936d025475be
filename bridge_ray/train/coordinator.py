"""The coordinator: the control plane of the actor graph, running BRIDGE rounds in the bilevel order (README,
"How the pieces fit").

:meth:`Coordinator.run_round` is the README's six steps, one short method each: rollout → reward → score →
retriever update (every P rounds; with the two-state estimator then η*'s) → policy update → sync, each phase
timed and tagged with the versions it ran under (``phases.jsonl``); the retriever updates of a round always end
before its policy update starts. The
coordinator holds no trajectory: the samplers send back a summary of each (:mod:`bridge_ray.rollout.summary`),
from which it checks the round (:mod:`bridge_ray.train.checks`), computes the GRPO advantages and picks the
rows the policy trains on, while trajectories, answer scores, adapters and weights go from actor to actor as
object refs. In synchronous mode (``rollout.max_staleness: 0``) every sample was drawn with the current policy
and retriever; in asynchronous mode (``max_staleness: s``) up to s batches are in flight ahead of the round being
trained: the samplers generate and score them while the learners run, so samples lag by at most s versions,
within the bound the round checks.

Every role is an :class:`ActorGroup` with its restart policy (``bridge_ray/runtime/actor_group.py``), called
through its typed handle (:class:`SamplerGroup`, :class:`RetrieverLearnerGroup`, :class:`PolicyLearnerGroup`),
whose calls return named ref bundles: the coordinator names no actor method and reads no ref by position. A dead
sampler is restarted by Ray, primed with the current adapter and weights and sent its call again; a dead shard
holder is restarted and its searches retried; a dead learner (a policy rank or the retriever learner) rolls
the run back to the last complete checkpoint and the round is redone. The coordinator runs inside a Ray actor
(``bridge_ray.train.coordinator_actor``).
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
import torch

from bridge_ray.algo.dynamic_sampling import keep_mixed_groups
from bridge_ray.algo.grpo import group_advantages
from bridge_ray.checkpoint import (
    CheckpointManager,
    Manifest,
    capture_rng_state,
    checkpoint_root,
    load_manifest,
)
from bridge_ray.config import Config, dump_config
from bridge_ray.data.qa import QuestionRecord, load_questions
from bridge_ray.evaluation.table import EvalTable, summarize
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.policy.learner import PolicyLearnerGroup, RagTerms, forward_record
from bridge_ray.progress import Progress, pieces_per_worker
from bridge_ray.retrieval.manifest import load_manifest as load_index_manifest
from bridge_ray.retrieval.shard_holder import start_shard_holders
from bridge_ray.retriever.handle import RetrieverLearnerGroup
from bridge_ray.rollout.handle import RolloutRefs, SamplerGroup, ScoreRefs, Serving
from bridge_ray.rollout.summary import RolloutSummary
from bridge_ray.runtime.actor_group import ActorGroup, Call, split_evenly
from bridge_ray.runtime.calls import ActorLost
from bridge_ray.runtime.placement import release_scale_up
from bridge_ray.telemetry import Telemetry
from bridge_ray.train.checks import check_complete_groups, check_staleness, rollout_record
from bridge_ray.train.cursor import loop_start
from bridge_ray.train.diagnostics import record_diagnostics
from bridge_ray.train.graph import start_retriever_learner, start_samplers
from bridge_ray.train.inputs import eval_files, index_dir, train_questions
from bridge_ray.train.phases import (
    LOWER_RETRIEVER_UPDATE,
    POLICY_UPDATE,
    RECOVER,
    RETRIEVER_UPDATE,
    REWARD,
    ROLLOUT,
    SCORE,
    SYNC,
    PhaseRecorder,
)


@dataclass
class RoundBatch:
    """A round's questions and the calls generating them (drawn up to ``max_staleness`` rounds ahead)."""

    # The data cursor and the RNG state before this batch was drawn: what a checkpoint taken before it records.
    cursor_state: dict[str, int]
    rng_state: dict[str, Any]
    questions: list[QuestionRecord]
    seeds: list[int]  # the sampling seed of each sampler's share
    rollouts: list[Call[RolloutRefs]]  # each sampler's share
    scores: list[Call[ScoreRefs]]  # on a retriever round, each sampler's answer scoring of its share, queued behind it
    sent: float  # when the rollouts were sent (before the previous round's learner updates, in async mode)


@dataclass
class Rollouts:
    """A round's rollouts as the coordinator holds them: the summaries here, the trajectories in the object store."""

    summaries: list[RolloutSummary]
    shares: list[Call[RolloutRefs]]  # each sampler's share as answered, in the summaries' order
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


class Coordinator:
    """Owns the round loop, the data cursor, the versions and the checkpoints of one training run."""

    def __init__(self, config: Config, *, resume: bool = False) -> None:
        self.config = config
        self.run_dir = Path(config.run.output_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(config))
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
        self._restore_loop_state(manifest)
        self._ahead: deque[RoundBatch] = deque()  # async mode: the next rounds' batches, being generated
        self._pushes: deque[tuple[list[Call], list[Call], int]] = deque()  # async mode: unconfirmed syncs
        self._target = config.run.rounds

        self.learner: PolicyLearnerGroup | None = None
        self.retriever_learner: RetrieverLearnerGroup | None = None
        self.shards: ActorGroup | None = None
        self.samplers: SamplerGroup | None = None
        self.adapter: ray.ObjectRef | None = None  # the retriever adapter the samplers serve, once exported
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
            wandb_entity=config.telemetry.wandb_entity,
            wandb_name=config.telemetry.wandb_name,
            resume=resume,
            ray_metrics=config.telemetry.ray_metrics,
        )

    def _restore_loop_state(self, manifest: Manifest | None) -> None:
        """Round counter, data cursor, RNG state and retriever version of ``manifest`` (the start of a run when
        None, :func:`loop_start`): together they fix the next round's questions and sampling seeds."""
        self.cursor = loop_start(self.config, len(self.train_set), manifest)
        self.round = manifest.round if manifest else 0
        self.retriever_version = manifest.retriever_version if manifest else 0

    # ---- graph ---------------------------------------------------------------------------------------

    def _start_actors(self, config: Config, index: Path, latest: Path | None) -> None:
        spec = config.retrieval.encoder.spec()
        load_index_manifest(index, spec)  # a wrong index fails here, naming both configurations
        holders, ix = config.roles.shard_holder, config.retrieval.index
        self.shards = start_shard_holders(
            index, spec, num_cpus=holders.cpus, num_gpus=holders.gpus, max_restarts=holders.max_restarts,
            hnsw_ef_search=ix.hnsw_ef_search, ivf_nprobe=ix.ivf_nprobe, timeout_s=config.learner.startup_timeout_s,
        )
        self._start_learners(latest)
        self.samplers = start_samplers(
            config, self.shards.named(), model_path=self.model_path, latest=latest,
            retriever_version=self.retriever_version, serving=self._serving,
        )
        self.samplers.versions()
        if self.learner.version > 0:
            self._sync_policy()

    def _start_learners(self, latest: Path | None) -> None:
        """The policy learner group and the retriever learner, from ``latest`` when given."""
        config = self.config
        self.learner = PolicyLearnerGroup(config, self.model_path, tokenizer_path=self.model_path)
        if latest is not None:
            self.learner.load(latest)
        self.adapter = None
        if config.algorithm.train_retriever:
            self.retriever_learner = start_retriever_learner(
                config, self.shards.handles, latest, self.retriever_version
            )

    def versions(self) -> tuple[int, int]:
        """(policy, retriever) versions of the learners: what the samplers must serve after a sync."""
        return (self.learner.version if self.learner else 0), self.retriever_version

    def _serving(self) -> Serving:
        """The run's current adapter and policy weights: what a revived sampler is sent."""
        weights = self.learner.weights_for_sync() if self.learner.version > 0 else None
        return Serving(self._current_adapter(), weights)

    def _current_adapter(self) -> ray.ObjectRef | None:
        """Ref to the retriever adapter the samplers serve (exported by the learner after its start), if any."""
        if self.retriever_learner is not None and self.adapter is None:
            self.adapter = self.retriever_learner.adapter()
        return self.adapter

    def _sync_policy(self, adapter_pushes: list[Call] | None = None, wait: bool = True) -> None:
        """Send the policy weights to every sampler, behind ``adapter_pushes`` already sent.

        With ``wait=False`` (async mode) a sync is confirmed only once ``max_staleness`` newer ones are queued:
        each sampler's pushes queue behind the batches it still generates, and waiting for them at once would
        drain the pipeline every round. The actor's call order still puts them before any later batch.
        """
        weights = self.samplers.update_policy(self.learner.weights_for_sync())
        self._pushes.append((adapter_pushes or [], weights, self.learner.version))
        while self._pushes and (wait or len(self._pushes) > self.config.rollout.max_staleness):
            adapters, weights, version = self._pushes.popleft()
            self.samplers.collect(adapters, "retriever adapter sync")
            served = self.samplers.collect(weights, "policy sync").values
            if set(served) != {version}:
                raise RuntimeError(f"samplers serve policy versions {served}, expected v{version}")

    # ---- the round -----------------------------------------------------------------------------------

    def _draw_batch(self, round_index: int) -> RoundBatch:
        """The next questions from the cursor, their rollouts (and on a retriever round their answer scoring)
        already sent to the samplers, so that each sampler scores its share as soon as it has generated it.

        Each sampler's share samples from a seed drawn here, from the RNG state checkpoints keep, so a resumed
        run, a redone round and a share re-sent to a revived sampler all sample from the same seeds.
        """
        cursor, rng = self.cursor.state_dict(), capture_rng_state()
        questions = [self.train_set[i] for i in self.cursor.next_batch()]
        seeds = torch.randint(2**31 - 1, (len(self.samplers),)).tolist()
        group_size = self.config.algorithm.grpo.rollouts_per_question
        calls = [
            self.samplers.rollout(i, part, group_size, seed)
            for i, (part, seed) in enumerate(zip(split_evenly(questions, len(self.samplers)), seeds, strict=True))
            if part
        ]
        scores = [self._score_call(call) for call in calls] if self._retriever_round(round_index) else []
        return RoundBatch(cursor, rng, questions, seeds, calls, scores, time.time())

    def _retriever_round(self, round_index: int) -> bool:
        objective = self.config.algorithm.retriever
        return self.config.algorithm.train_retriever and round_index % objective.update_period == 0

    def _score_call(self, rollout: Call[RolloutRefs]) -> Call[ScoreRefs]:
        """The answer scoring of ``rollout``'s trajectories, on the sampler that generated them (with Drop and
        two-state also the scored token ids, for the policy ranks' L_RAG terms)."""
        return self.samplers.score(rollout, with_groups=self.config.algorithm.estimator != "bridge")

    def _draw_ahead(self) -> None:
        """Async mode: keep ``max_staleness`` batches in flight (fewer near the run's end)."""
        depth = min(self.config.rollout.max_staleness, self._target - self.round - 1) if self.asynchronous else 0
        while len(self._ahead) < depth:
            self._ahead.append(self._draw_batch(self.round + 1 + len(self._ahead)))

    def run_round(self, total: int | None = None) -> dict[str, float]:
        """One BRIDGE round (README, "How the pieces fit"); returns its figures, also logged. ``total``: the rounds
        its caller runs in all, the N of the ``[round r/N ETA]`` line (default: the run's; the benches time a few
        rounds of a graph whose ``run.rounds`` only keeps its last round from checkpointing)."""
        started = time.time()
        batch = self._ahead.popleft() if self._ahead else self._draw_batch(self.round)
        self._draw_ahead()
        self.samplers.revived.clear()
        figures: dict[str, float] = {}
        rollouts = self._rollout(batch, figures)
        advantages = self._reward(rollouts, figures)
        scores = self._score(batch, rollouts)
        adapter_pushes, rag = self._update_retriever(rollouts, scores, advantages, figures)
        rag = self._update_lower_retriever(rag, figures)
        self._update_policy(rollouts, advantages, rag, figures)
        self._sync(adapter_pushes)
        self._end_round(rollouts, started, figures, total or self._target)
        return figures

    def _rollout(self, batch: RoundBatch, figures: dict[str, float]) -> Rollouts:
        """1. The samplers' summaries, checked: every question's G samples once, within the staleness bound."""
        cfg = self.config
        with self.phases.phase(self.round, ROLLOUT) as info:
            shares = self.samplers.collect(batch.rollouts, "rollout")
            summaries = [s for part in shares.values for s in part]
            check_complete_groups(summaries, batch.questions, cfg.algorithm.grpo.rollouts_per_question)
            policy_lag, retriever_lag = check_staleness(summaries, *self.versions(), cfg.rollout.max_staleness)
            info |= rollout_record(summaries)
            info |= {"questions": len(batch.questions), "question_ids": [q.uid for q in batch.questions],
                     "sampler_seeds": batch.seeds, "sent": batch.sent}
        figures |= {"staleness/policy": policy_lag, "staleness/retriever": retriever_lag}
        return Rollouts(summaries, shares.calls, shares.resent)

    def _reward(self, rollouts: Rollouts, figures: dict[str, float]) -> torch.Tensor:
        """2. The GRPO advantage of every trajectory within its question's group, and the round's diagnostics."""
        grpo = self.config.algorithm.grpo
        with self.phases.phase(self.round, REWARD) as info:
            advantages = group_advantages(rollouts.rewards, rollouts.uids, grpo.adv_eps, grpo.scale_adv_by_std)
            figures |= record_diagnostics(self.round, rollouts.summaries, info)
        return advantages

    def _score(self, batch: RoundBatch, rollouts: Rollouts) -> list[Call[ScoreRefs]]:
        """3. On a retriever round, each sampler's answer likelihoods of its own share's searches, as answered.

        The scoring was sent with the rollouts (in async mode it ran while the learners worked on an earlier
        round); a share re-sent to a revived sampler is scored again from its new trajectories.
        """
        if not batch.scores:
            return []
        scores = [
            self._score_call(share) if i in rollouts.resent else score
            for i, (share, score) in enumerate(zip(rollouts.shares, batch.scores, strict=True))
        ]
        with self.phases.phase(self.round, SCORE):
            return self.samplers.collect(scores, "answer scoring").calls

    def _update_retriever(
        self, rollouts: Rollouts, scores: list[Call[ScoreRefs]], advantages: torch.Tensor, figures: dict[str, float]
    ) -> tuple[list[Call], RagTerms | None]:
        """4. The retriever learner's update on every scored search. Returns the adapter pushes to the samplers
        still to collect (async mode: they queue behind the batches in flight) and, with Drop and two-state,
        the round's L_RAG terms for the policy update."""
        rag = None
        if not scores:
            return [], rag
        with self.phases.phase(self.round, RETRIEVER_UPDATE) as info:
            info["turns"] = sum(s.searches for s in rollouts.summaries)
            if not info["turns"]:
                return [], rag
            answer_logp = [c.out.answer_logp for c in scores]
            learner = self.retriever_learner
            update = learner.update(rollouts.trajectories, answer_logp, advantages)
            [(stats, self.retriever_version)] = learner.collect([update], "update").values
            if (estimator := self.config.algorithm.estimator) != "bridge":
                gamma = self.config.algorithm.retriever.gamma
                rag = RagTerms(estimator, gamma, [c.out.groups for c in scores], update.out.rows)
            self.adapter = update.out.adapter
            pushes = self.samplers.set_adapter(self.adapter)
            if not self.asynchronous:
                self.samplers.collect(pushes, "retriever adapter sync")
                pushes = []
            figures |= {f"retriever/{k}": v for k, v in stats.items()}
        return pushes, rag

    def _update_lower_retriever(self, rag: RagTerms | None, figures: dict[str, float]) -> RagTerms | None:
        """4b. Two-state only: η*'s own update on L_RAG alone (a phase of its own, before the policy update);
        ``rag`` then also holds η*'s log ρ."""
        if rag is None or rag.estimator != "two_state":
            return rag
        with self.phases.phase(self.round, LOWER_RETRIEVER_UPDATE):
            lower = self.retriever_learner.update_lower()
            [stats] = self.retriever_learner.collect([lower], "update of eta*").values
            figures |= {f"lower_retriever/{k}": v for k, v in stats.items()}
        return replace(rag, lower=lower.out.rows)

    def _update_policy(
        self, rollouts: Rollouts, advantages: torch.Tensor, rag: RagTerms | None, figures: dict[str, float]
    ) -> None:
        """5. The policy ranks' update on the rows kept, which they fetch and batch themselves, plus the L_RAG
        terms of ``rag`` (none when ``algorithm.train_policy`` is false: the policy stays frozen and the round
        has no such phase). Its record holds the forward passes the update ran (:func:`forward_record`)."""
        if not self.config.algorithm.train_policy:
            return
        with self.phases.phase(self.round, POLICY_UPDATE, estimator=self.config.algorithm.estimator) as info:
            rows = self._policy_rows(rollouts)
            info["groups"] = figures["policy/groups"] = len({rollouts.uids[i] for i in rows.tolist()})
            metrics = self.learner.train_on(rollouts.trajectories, rows.tolist(), advantages[rows], rag)
            info |= forward_record(metrics)
            figures |= {f"policy/{k}": v for k, v in metrics.items()}

    def _sync(self, adapter_pushes: list[Call]) -> None:
        """6. Every sampler serves the new adapter and policy weights before it rolls out again."""
        with self.phases.phase(self.round, SYNC):
            if not self.config.algorithm.train_policy:  # frozen policy: the samplers already serve its weights
                self.samplers.collect(adapter_pushes, "retriever adapter sync")
                return
            self._sync_policy(adapter_pushes, wait=not self.asynchronous)

    def _end_round(self, rollouts: Rollouts, started: float, figures: dict[str, float], total: int) -> None:
        """Check the round's order, count it, checkpoint and evaluate when due, and log its figures."""
        cfg, r = self.config, self.round
        self.phases.check_round(r)
        self.round += 1
        figures |= {f"time/{k}": v for k, v in self.phases.round_seconds(r).items()}
        if self.round % cfg.checkpoint.every_rounds == 0 or self.round == cfg.run.rounds:
            figures["checkpoint_round"] = float(self.save())
        if cfg.eval.every_rounds and self.round % cfg.eval.every_rounds == 0:
            figures |= {f"eval/{k}": v for k, v in _eval_figures(self.evaluate("round")).items()}
        figures["time/round"] = time.time() - started
        figures["throughput/tokens_per_s"] = sum(s.action_tokens for s in rollouts.summaries) / figures["time/round"]
        figures |= {"policy_version": self.learner.version, "retriever_version": self.retriever_version,
                    "faults/samplers_revived": len(self.samplers.revived)}
        self.telemetry.log(r, figures, total=total)

    def _policy_rows(self, rollouts: Rollouts) -> torch.Tensor:
        """The rows the policy trains on: all of them, or with ``rollout.dynamic_sampling`` the first
        ``questions_per_batch`` groups with mixed rewards (all rows when there is none: the update then
        carries no policy-gradient signal, and the round's warning says so)."""
        every = torch.arange(len(rollouts.summaries))
        if not self.config.rollout.dynamic_sampling:
            return every
        kept = keep_mixed_groups(rollouts.rewards, rollouts.uids, self.config.rollout.questions_per_batch)
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
        while self._pushes:  # the last rounds' syncs, before anything evaluates the samplers
            adapters, weights, _ = self._pushes.popleft()
            self.samplers.collect([*adapters, *weights], "sync")
        return self.round

    def _roll_back(self, failure: Exception) -> None:
        """Rebuild both learners from the last complete checkpoint and make the samplers serve it.

        Everything the failed round did is dropped: its retriever and policy updates, its batch and the
        batch drawn ahead. The process group cannot take back a new member, so the whole group is rebuilt.
        """
        latest = self.checkpoints.latest()
        with self.phases.phase(self.round, RECOVER, failure=str(failure)) as info:
            print(f"round {self.round} failed ({failure}); going back to {latest or 'the start'}", flush=True)
            self._ahead.clear()
            self._pushes.clear()
            self.learner.shutdown(graceful=False)
            if self.retriever_learner is not None:
                self.retriever_learner.shutdown()
            self._restore_loop_state(load_manifest(latest) if latest is not None else None)
            self._start_learners(latest)
            if (adapter := self._current_adapter()) is not None:
                self.samplers.collect(self.samplers.set_adapter(adapter), "retriever adapter after a rollback")
            self._sync_policy()  # the checkpoint's weights, checked against the rebuilt learner's version
            info["restored_round"] = self.round

    # ---- checkpoints and evaluation ------------------------------------------------------------------

    def save(self) -> int:
        """Checkpoint the completed rounds: policy (HF + DeepSpeed state), retriever adapter, loop state."""
        # Batches drawn ahead are drawn again by a resumed run: record the state from before them.
        cursor, rng = (
            (self._ahead[0].cursor_state, self._ahead[0].rng_state) if self._ahead
            else (self.cursor.state_dict(), capture_rng_state())
        )
        manifest = Manifest(
            round=self.round, policy_version=self.learner.version, retriever_version=self.retriever_version,
            data_cursor=cursor, rng=rng,
        )

        def write(directory: Path) -> None:
            self.learner.save(directory)
            if self.retriever_learner is not None:
                self.retriever_learner.save(str(directory))

        path = self.checkpoints.save(manifest, write, self.config)
        self.telemetry.log_checkpoint(path)
        return self.round

    def evaluate(self, label: str, eval_sets: dict[str, list[QuestionRecord]] | None = None) -> EvalTable:
        """Greedy rollouts of the current policy and retriever on every eval set, spread over the samplers.

        Each set is cut into pieces (about a tenth of it each when it is large, :func:`pieces_per_worker`), whose
        progress is reported as they finish. Each table is appended to ``eval.jsonl`` under ``label`` ("before",
        "round", "after") with the round and versions it measured: the run's learning curve in one file.
        """
        per_dataset = {}
        for name, questions in (eval_sets or self.eval_sets).items():
            pieces = pieces_per_worker(len(questions), len(self.samplers))
            calls = self.samplers.evaluate(questions, pieces_per_actor=pieces)
            per_dataset[name] = []
            with Progress(len(questions), f"evaluation on {name}", "questions") as progress:
                for call in calls:  # in order: a line (or a bar's step) per finished piece
                    [part] = self.samplers.collect([call], f"evaluation on {name}").values
                    per_dataset[name] += part
                    progress.update(len(part))
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

    def shutdown(self) -> None:
        """End every actor of the graph; each group frees its placement group once its actors are gone."""
        if getattr(self, "telemetry", None) is not None:
            self.telemetry.close()
        if self.learner is not None:
            self.learner.shutdown()
            self.learner = None
        for group in (self.samplers, self.shards, self.retriever_learner):
            if group is not None:
                group.shutdown()
        self.samplers = self.shards = self.retriever_learner = None


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

