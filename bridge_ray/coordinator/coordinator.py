"""The coordinator: the control plane of the actor graph, running BRIDGE rounds in the bilevel order (README,
"How the pieces fit").

:meth:`Coordinator.run_round` is the README's six steps, one short method each: rollout → reward → score →
retriever update (every P rounds; with the two-state estimator then η*'s) → policy update → sync, each phase
timed and tagged with the versions it ran under (``phases.jsonl``); the retriever updates of a round always end
before its policy update starts. The coordinator holds no trajectory: the samplers send back a summary of each
(:mod:`bridge_ray.sampler.summary`), from which it checks the round (:mod:`bridge_ray.coordinator.checks`), computes the
GRPO advantages and picks the rows the policy trains on, while trajectories, answer scores, adapters and weights
go from actor to actor as object refs.

The roles are a :class:`~bridge_ray.coordinator.graph.Graph` (started, health-checked and stopped there), each called
through its typed handle, whose calls return named ref bundles: the coordinator names no actor method and reads
no ref by position. The batches drawn ahead and the syncs not yet confirmed are a
:class:`~bridge_ray.coordinator.pipeline.RoundPipeline` whose depth is ``rollout.max_staleness``: synchronous training
is depth 0, and a round runs the same code at any depth. A dead sampler is restarted by Ray, primed with the
current adapter and weights and sent its call again; a dead shard holder is restarted and its searches retried;
a dead learner (a policy rank or the retriever learner) rolls the run back to the last complete checkpoint and
the round is redone. The coordinator runs inside a Ray actor (``bridge_ray.coordinator.handle``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bridge_ray.algo.dynamic_sampling import keep_mixed_groups
from bridge_ray.algo.grpo import group_advantages
from bridge_ray.checkpoint import CheckpointManager, Manifest, capture_rng_state, checkpoint_root, load_manifest
from bridge_ray.config import Config, dump_config
from bridge_ray.coordinator import phases
from bridge_ray.coordinator.checks import check_complete_groups, check_staleness, rollout_record
from bridge_ray.coordinator.cursor import loop_start
from bridge_ray.coordinator.diagnostics import record_diagnostics
from bridge_ray.coordinator.graph import Graph, Sync
from bridge_ray.coordinator.graph_eval import append_eval_record, eval_figures, evaluate_on_samplers
from bridge_ray.coordinator.inputs import eval_files, train_questions
from bridge_ray.coordinator.pipeline import RoundBatch, RoundPipeline
from bridge_ray.data.qa import QuestionRecord, load_questions
from bridge_ray.evaluation.table import EvalTable
from bridge_ray.policy_learner.learner import RagTerms, forward_record
from bridge_ray.runtime.actor_group import Call, split_evenly
from bridge_ray.runtime.calls import ActorLost
from bridge_ray.sampler.handle import Rollouts
from bridge_ray.sampler.sampler import RolloutReturns, ScoreReturns
from bridge_ray.telemetry import Telemetry


class Coordinator:
    """Owns the round loop, the data cursor, the versions and the checkpoints of one training run.

    ``start_graph`` starts the roles (:meth:`Graph.start`; the unit tests give a graph of fakes).
    """

    def __init__(
        self, config: Config, *, resume: bool = False,
        start_graph: Callable[[Config, Path | None], Graph] = Graph.start,
    ) -> None:
        self.config = config
        self.run_dir = Path(config.run.output_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(config))
        self.checkpoints = CheckpointManager(checkpoint_root(config), config.checkpoint.keep)
        latest = self.checkpoints.latest() if resume else None
        if resume and latest is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {checkpoint_root(config)}")
        self.train_set = train_questions(config)
        self.eval_sets = {
            name: load_questions([path])[: config.eval.max_questions] for name, path in eval_files(config).items()
        }
        self._restore_loop_state(load_manifest(latest) if latest is not None else None)
        if latest is not None:  # in the job's log: which checkpoint a resubmitted run took up
            print(f"resuming from {latest}: round {self.round}", flush=True)
        self.graph = start_graph(config, latest)
        self.pipeline: RoundPipeline[Sync] = RoundPipeline(
            config.rollout.max_staleness, config.run.rounds, self._draw_batch, self.graph.confirm
        )
        self.phases = phases.PhaseRecorder(self.versions, self.run_dir / "phases.jsonl")
        wandb = config.telemetry
        self.telemetry = Telemetry(
            self.run_dir, self.run_dir.name, config=config.model_dump(), wandb_mode=wandb.wandb_mode,
            wandb_project=wandb.wandb_project, wandb_entity=wandb.wandb_entity, wandb_name=wandb.wandb_name,
            resume=resume, ray_metrics=wandb.ray_metrics,
        )

    def _restore_loop_state(self, manifest: Manifest | None) -> None:
        """Round counter, data cursor, RNG state and retriever version of ``manifest`` (the start of a run when
        None, :func:`loop_start`): together they fix the next round's questions and sampling seeds."""
        self.cursor = loop_start(self.config, len(self.train_set), manifest)
        self.round = manifest.round if manifest else 0
        self.retriever_version = manifest.retriever_version if manifest else 0

    def versions(self) -> tuple[int, int]:
        """(policy, retriever) versions of the learners: what the samplers must serve after a sync."""
        return self.graph.policy_version, self.retriever_version

    # ---- the round -----------------------------------------------------------------------------------

    def _draw_batch(self, round_index: int) -> RoundBatch:
        """The next questions from the cursor, their rollouts (and on a retriever round their answer scoring)
        already sent to the samplers, so that each sampler scores its share as soon as it has generated it.

        Each sampler's share samples from a seed drawn here, from the RNG state checkpoints keep, so a resumed
        run, a redone round and a share re-sent to a revived sampler all sample from the same seeds.
        """
        samplers = self.graph.samplers
        cursor, rng = self.cursor.state_dict(), capture_rng_state()
        questions = [self.train_set[i] for i in self.cursor.next_batch()]
        seeds = torch.randint(2**31 - 1, (len(samplers),)).tolist()
        group_size = self.config.algorithm.grpo.rollouts_per_question
        calls = [
            samplers.rollout(i, part, group_size, seed)
            for i, (part, seed) in enumerate(zip(split_evenly(questions, len(samplers)), seeds, strict=True))
            if part
        ]
        scores = [self._score_call(call) for call in calls] if self._retriever_round(round_index) else []
        return RoundBatch(cursor, rng, questions, seeds, calls, scores, time.time())

    def _retriever_round(self, round_index: int) -> bool:
        objective = self.config.algorithm.retriever
        return self.config.algorithm.train_retriever and round_index % objective.update_period == 0

    def _score_call(self, rollout: Call[RolloutReturns]) -> Call[ScoreReturns]:
        """The answer scoring of ``rollout``'s trajectories, on the sampler that generated them (with Drop and
        two-state also the scored token ids, for the policy ranks' L_RAG terms)."""
        estimator = self.config.algorithm.estimator
        return self.graph.samplers.score(rollout.index, rollout.out.trajectories, estimator != "bridge")

    def run_round(self, total: int | None = None) -> dict[str, float]:
        """One BRIDGE round (README, "How the pieces fit"); returns its figures, also logged. ``total``: the rounds
        its caller runs in all, the N of the ``[round r/N ETA]`` line (default: the run's; the benches time a few
        rounds of a graph whose ``run.rounds`` only keeps its last round from checkpointing)."""
        started = time.time()
        batch = self.pipeline.next_batch(self.round)
        self.graph.samplers.revived.clear()
        figures: dict[str, float] = {}
        rollouts = self._rollout(batch, figures)
        advantages = self._reward(rollouts, figures)
        scores = self._score(batch, rollouts)
        adapter_pushes, rag = self._update_retriever(rollouts, scores, advantages, figures)
        rag = self._update_lower_retriever(rag, scores, figures)
        self._update_policy(rollouts, advantages, rag, figures)
        self._sync(adapter_pushes)
        self._end_round(rollouts, started, figures, total or self.config.run.rounds)
        return figures

    def _rollout(self, batch: RoundBatch, figures: dict[str, float]) -> Rollouts:
        """1. The samplers' summaries, checked: every question's G samples once, within the staleness bound."""
        cfg = self.config
        with self.phases.phase(self.round, phases.ROLLOUT) as info:
            shares = self.graph.samplers.collect(batch.rollouts, "rollout")
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
        with self.phases.phase(self.round, phases.REWARD) as info:
            advantages = group_advantages(rollouts.rewards, rollouts.uids, grpo.adv_eps, grpo.scale_adv_by_std)
            figures |= record_diagnostics(self.round, rollouts.summaries, info)
        return advantages

    def _score(self, batch: RoundBatch, rollouts: Rollouts) -> list[Call[ScoreReturns]]:
        """3. On a retriever round, each sampler's answer likelihoods of its own share's searches, as answered.

        The scoring was sent with the rollouts (for a batch drawn ahead, it ran while the learners worked on an
        earlier round); a share re-sent to a revived sampler is scored again from its new trajectories.
        """
        if not batch.scores:
            return []
        scores = [
            self._score_call(share) if i in rollouts.resent else score
            for i, (share, score) in enumerate(zip(rollouts.shares, batch.scores, strict=True))
        ]
        with self.phases.phase(self.round, phases.SCORE):
            return self.graph.samplers.collect(scores, "answer scoring").calls

    def _update_retriever(
        self, rollouts: Rollouts, scores: list[Call[ScoreReturns]], advantages: torch.Tensor, figures: dict[str, float]
    ) -> tuple[list[Call], RagTerms | None]:
        """4. The retriever learner's update on every scored search. Returns the new adapter's pushes to the
        samplers (confirmed with the round's sync) and, with Drop and two-state, the round's L_RAG terms for the
        policy update."""
        rag = None
        if not scores:
            return [], rag
        with self.phases.phase(self.round, phases.RETRIEVER_UPDATE) as info:
            info["turns"] = sum(s.searches for s in rollouts.summaries)
            if not info["turns"]:
                return [], rag
            answer_logp = [c.out.answer_logp for c in scores]
            learner = self.graph.retriever_learner
            update = learner.update(rollouts.trajectories, answer_logp, advantages)
            [(stats, self.retriever_version)] = learner.collect([update], "update").values
            if (estimator := self.config.algorithm.estimator) != "bridge":
                gamma = self.config.algorithm.retriever.gamma
                rag = RagTerms(estimator, gamma, [c.out.groups for c in scores], update.out.rows)
            self.graph.adapter = update.out.adapter
            pushes = self.graph.samplers.set_adapter(update.out.adapter)
            figures |= {f"retriever/{k}": v for k, v in stats.items()}
        return pushes, rag

    def _update_lower_retriever(self, rag: RagTerms | None, logged: list[Call[ScoreReturns]],
                                figures: dict[str, float]) -> RagTerms | None:
        """4b. Two-state only: η*'s update on L_RAG alone (a phase of its own, before the policy update), with
        ``two_state.candidates: own`` on its own candidates (:meth:`_score_own`); ``rag`` then holds η*'s terms."""
        if rag is None or rag.estimator != "two_state":
            return rag
        with self.phases.phase(self.round, phases.LOWER_RETRIEVER_UPDATE) as info:
            own = self._score_own(logged, info) if self.config.algorithm.two_state.candidates == "own" else None
            lower = self.graph.retriever_learner.update_lower(own and [c.out.answer_logp for c in own])
            [stats] = self.graph.retriever_learner.collect([lower], "update of eta*").values
            figures |= {f"lower_retriever/{k}": v for k, v in (stats | info).items()}
        return replace(rag, lower=lower.out.rows, lower_groups=own and [c.out.groups for c in own])

    def _score_own(self, logged: list[Call[ScoreReturns]], info: dict) -> list[Call[ScoreReturns]]:
        """η*'s own top k for every logged query, share by share, scored by the sampler that scored the share's
        logged candidates, with the groups the policy's −γ∇θ L_RAG(θ, η*) differentiates; ``info`` records it."""
        started, learner = time.time(), self.graph.retriever_learner
        own = [learner.own_candidates(share) for share in range(len(logged))]
        calls = [self.graph.samplers.score(s.index, o.out.trajectories, True) for s, o in zip(logged, own, strict=True)]
        learner.collect(own, "eta*'s own candidates")
        scored = self.graph.samplers.collect(calls, "answer scoring of eta*'s candidates")
        info |= {"own_scored": sum(scored.values), "own_score_seconds": time.time() - started}
        return scored.calls

    def _update_policy(
        self, rollouts: Rollouts, advantages: torch.Tensor, rag: RagTerms | None, figures: dict[str, float]
    ) -> None:
        """5. The policy ranks' update on the rows kept, which they fetch and batch themselves, plus the L_RAG
        terms of ``rag``; none when ``algorithm.train_policy`` is false or no row is kept (the round then has no
        such phase). Its record holds the forward passes the update ran (:func:`forward_record`)."""
        rows = self._policy_rows(rollouts, rag)
        if not (self.config.algorithm.train_policy and rows.numel()):
            return
        with self.phases.phase(self.round, phases.POLICY_UPDATE, estimator=self.config.algorithm.estimator) as info:
            info["groups"] = figures["policy/groups"] = len({rollouts.uids[i] for i in rows.tolist()})
            metrics = self.graph.learner.train_on(rollouts.trajectories, rows.tolist(), advantages[rows], rag)
            info |= forward_record(metrics)
            figures |= {f"policy/{k}": v for k, v in metrics.items()}

    def _sync(self, adapter_pushes: list[Call]) -> None:
        """6. Every sampler serves the new adapter and policy weights before it rolls out again (confirmed once
        the pipeline holds ``max_staleness`` newer syncs: at once in synchronous training)."""
        with self.phases.phase(self.round, phases.SYNC):
            self.pipeline.sent(self.graph.send_sync(adapter_pushes))

    def _end_round(self, rollouts: Rollouts, started: float, figures: dict[str, float], total: int) -> None:
        """Check the round's order, count it, checkpoint and evaluate when due, and log its figures."""
        cfg, r = self.config, self.round
        self.phases.check_round(r)
        self.round += 1
        figures |= {f"time/{k}": v for k, v in self.phases.round_seconds(r).items()}
        if self.round % cfg.checkpoint.every_rounds == 0 or self.round == cfg.run.rounds:
            figures["checkpoint_round"] = float(self.save())
        if cfg.eval.every_rounds and self.round % cfg.eval.every_rounds == 0:
            figures |= {f"eval/{k}": v for k, v in eval_figures(self.evaluate("round")).items()}
        figures["time/round"] = time.time() - started
        figures["throughput/tokens_per_s"] = sum(s.action_tokens for s in rollouts.summaries) / figures["time/round"]
        figures |= {"policy_version": self.versions()[0], "retriever_version": self.retriever_version,
                    "faults/samplers_revived": len(self.graph.samplers.revived)}
        self.telemetry.log(r, figures, total=total)

    def _policy_rows(self, rollouts: Rollouts, rag: RagTerms | None) -> torch.Tensor:
        """All rows, or with ``rollout.dynamic_sampling`` the first ``questions_per_batch`` groups with mixed
        rewards; with none, all rows if a KL or L_RAG term remains, else none: no policy update this round."""
        every = torch.arange(len(rollouts.summaries))
        if not self.config.rollout.dynamic_sampling:
            return every
        kept = keep_mixed_groups(rollouts.rewards, rollouts.uids, self.config.rollout.questions_per_batch)
        return every if not kept.numel() and (self.config.algorithm.grpo.kl_coef > 0 or rag is not None) else kept

    def run(self, rounds: int | None = None) -> int:
        """Run until ``rounds`` (default ``run.rounds``) rounds are complete; returns the round counter.

        A learner that dies (:class:`ActorLost`) sends the run back to its last complete checkpoint, up
        to ``run.max_learner_failures`` times in a row.
        """
        target = self.config.run.rounds if rounds is None else rounds
        failures = 0
        while self.round < target:
            try:
                self.run_round(target)
                failures = 0
            except ActorLost as exc:
                failures += 1
                if failures > self.config.run.max_learner_failures:
                    raise
                self._roll_back(exc)
        self.pipeline.drain()  # the last rounds' syncs, before anything evaluates the samplers
        return self.round

    def _roll_back(self, failure: Exception) -> None:
        """Rebuild both learners from the last complete checkpoint and make the samplers serve it.

        Everything the failed round did is dropped: its retriever and policy updates, its batch and the
        batches drawn ahead, and the syncs not yet confirmed.
        """
        latest = self.checkpoints.latest()
        with self.phases.phase(self.round, phases.RECOVER, failure=str(failure)) as info:
            print(f"round {self.round} failed ({failure}); going back to {latest or 'the start'}", flush=True)
            self.pipeline.drop()
            self._restore_loop_state(load_manifest(latest) if latest is not None else None)
            self.graph.restart_learners(latest)
            info["restored_round"] = self.round

    # ---- checkpoints and evaluation ------------------------------------------------------------------

    def save(self) -> int:
        """Checkpoint the completed rounds: the learners' state (:meth:`Graph.save`) and the loop state."""
        # Batches drawn ahead are drawn again by a resumed run: record the state from before them.
        cursor, rng = self.pipeline.drawn_from() or (self.cursor.state_dict(), capture_rng_state())
        manifest = Manifest(
            round=self.round, policy_version=self.versions()[0], retriever_version=self.retriever_version,
            data_cursor=cursor, rng=rng,
        )
        path = self.checkpoints.save(manifest, self.graph.save, self.config)
        self.telemetry.log_checkpoint(path)
        return self.round

    def evaluate(self, label: str, eval_sets: dict[str, list[QuestionRecord]] | None = None) -> EvalTable:
        """Greedy rollouts of the current policy and retriever on every eval set, spread over the samplers. Each
        table is appended to ``eval.jsonl`` under ``label`` ("before", "round", "after") with the round and
        versions it measured: the run's learning curve in one file."""
        table = evaluate_on_samplers(self.graph.samplers, eval_sets or self.eval_sets)
        policy_version, retriever_version = self.versions()
        append_eval_record(self.run_dir, table, label=label, round=self.round, policy_version=policy_version,
                           retriever_version=retriever_version)
        return table

    def state(self) -> dict[str, Any]:
        """Round counter, versions and data cursor (what a resumed run must reproduce)."""
        policy_version, retriever_version = self.versions()
        return {"round": self.round, "policy_version": policy_version, "retriever_version": retriever_version,
                "data_cursor": self.cursor.state_dict()}

    def phase_seconds(self) -> dict[str, float]:
        """Seconds in each phase over the rounds this coordinator ran (the run's ``timings.json`` splits its
        rounds by them)."""
        return self.phases.total_seconds()

    def shutdown(self) -> None:
        """Close the telemetry and end every actor of the graph."""
        self.telemetry.close()
        self.graph.shutdown()

