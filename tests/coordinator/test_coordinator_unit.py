"""The coordinator's round logic driven through a graph of fake role handles, without Ray: the bilevel order, the
async depth, a share sent again to a revived sampler and a rollback after a learner died, in seconds.

The fakes stand in for the typed handles (``SamplerGroup``, ``RetrieverLearnerGroup``, ``PolicyLearnerGroup``)
inside a real :class:`Graph` and answer with the same named bundles, whose "refs" are plain values. A fake actor
runs a call when it is sent, which is the order a real actor runs its calls in (one queue per actor), and logs it
with the versions it serves then. The coordinator's own checks (complete groups, the staleness bound, the bilevel
order of ``phases.jsonl``) and the graph's sync checks run as in a real run. The end-to-end tests
(tests/train/test_training_job.py, test_fault_tolerance.py, tests/cluster/test_submit_multinode.py) run the
same rounds on real actors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from job_fixtures import job_config

from bridge_ray.checkpoint import POLICY_DIR, CheckpointManager, load_manifest
from bridge_ray.config import Config
from bridge_ray.coordinator.coordinator import Coordinator
from bridge_ray.coordinator.graph import Graph
from bridge_ray.coordinator.phases import read_phases
from bridge_ray.policy_learner.learner import FORWARD_COUNTS
from bridge_ray.retriever_learner.learner import (
    LowerUpdateReturns,
    OwnCandidateReturns,
    RetrieverLearner,
    RetrieverUpdateReturns,
)
from bridge_ray.runtime.actor_group import Call, Collected
from bridge_ray.runtime.calls import ActorLost
from bridge_ray.sampler.handle import Serving
from bridge_ray.sampler.sampler import RolloutReturns, Sampler, ScoreReturns
from bridge_ray.sampler.summary import RolloutSummary

SAMPLERS = 2
TURNS = 3  # the retrieval turns a fake sampler scores per share


class FakeSamplers:
    """Two samplers serving (policy, retriever) versions; ``die_in_rollout`` kills one in its next rollout. Each
    group's rewards alternate 1, 0, ..., or with ``flat`` are all 0."""

    def __init__(self, log: list[tuple], serving) -> None:
        self.log, self.serving = log, serving
        self.served = [[0, 0] for _ in range(SAMPLERS)]
        self.revived: list[int] = []
        self.die_in_rollout: int | None = None
        self.flat = False

    def __len__(self) -> int:
        return SAMPLERS

    def rollout(self, index, questions, group_size, seed) -> Call[RolloutReturns]:
        policy, retriever = self.served[index]
        self.log.append(("rollout", index, seed, policy, retriever))
        summaries = [
            RolloutSummary(q.uid, k, 0.0 if self.flat else float((seed + k) % 2), policy, (retriever,), 8, 4, 2, 0,
                           True, False, None, f"{seed}-{k}")
            for q in questions for k in range(group_size)
        ]
        trajectories = ("trajectories", index, seed, len(self.log))  # a new ref for every call
        return Call(index, Sampler.rollout, (questions, group_size, seed), (summaries, trajectories), RolloutReturns)

    def score(self, index: int, trajectories, with_groups: bool) -> Call[ScoreReturns]:
        self.log.append(("score", index, trajectories))
        groups = ("groups", trajectories) if with_groups else None
        refs = (TURNS, ("answer_logp", trajectories), groups)
        return Call(index, Sampler.score, (trajectories, with_groups), refs, ScoreReturns)

    def set_adapter(self, adapter) -> list[Call]:
        return [self._push(i, "set_adapter", adapter) for i in range(SAMPLERS)]

    def update_policy(self, weights) -> list[Call]:
        return [self._push(i, "update_policy", weights) for i in range(SAMPLERS)]

    def _push(self, index: int, what: str, ref: tuple[str, int]) -> Call:
        self.served[index][what == "set_adapter"] = ref[1]
        self.log.append((what, index, ref[1]))
        return Call(index, Sampler.update_policy, (ref,), (ref[1],))

    def collect(self, calls, what) -> Collected:
        """As ``ActorGroup.collect`` under RESEND: a dead sampler is revived, primed and sent its call again."""
        answered, resent = [], set()
        for position, call in enumerate(calls):
            if call.method is Sampler.rollout and call.index == self.die_in_rollout:
                self.die_in_rollout = None
                self.served[call.index] = [0, 0]  # a restarted actor serves what its constructor loaded
                self.log.append(("revived", call.index))
                serving: Serving = self.serving()
                if serving.adapter is not None:
                    self._push(call.index, "set_adapter", serving.adapter)
                if serving.weights is not None:
                    self._push(call.index, "update_policy", serving.weights)
                self.revived.append(call.index)
                call, resent = self.rollout(call.index, *call.args), resent | {position}
            answered.append(call)
        return Collected([call.refs[0] for call in answered], answered, frozenset(resent))

    def shutdown(self) -> None:
        pass


class FakeRetrieverLearner:
    def __init__(self, log: list[tuple], version: int) -> None:
        self.log, self.version = log, version

    def adapter(self) -> tuple[str, int]:
        return ("adapter", self.version)

    def update(self, trajectories, answer_logp, advantages) -> Call[RetrieverUpdateReturns]:
        self.version += 1
        self.log.append(("retriever_update", self.version, tuple(trajectories), tuple(answer_logp)))
        refs = (({"loss": 0.0}, self.version), ("adapter", self.version), None)
        return Call(0, RetrieverLearner.update, (), refs, RetrieverUpdateReturns)

    def own_candidates(self, share: int) -> Call[OwnCandidateReturns]:
        self.log.append(("own_candidates", share, self.version))
        refs = (TURNS, ("own", share, self.version))
        return Call(0, RetrieverLearner.own_candidates, (share,), refs, OwnCandidateReturns)

    def update_lower(self, answer_logp=None) -> Call[LowerUpdateReturns]:
        self.log.append(("lower_update", answer_logp))
        refs = ({"loss": 0.0}, ("lower_rows", self.version))
        return Call(0, RetrieverLearner.update_lower, (answer_logp,), refs, LowerUpdateReturns)

    def collect(self, calls, what) -> Collected:
        return Collected([call.refs[0] for call in calls], list(calls))

    def save(self, directory: str) -> None:
        pass

    def shutdown(self) -> None:
        pass


class FakePolicyLearner:
    """The policy ranks; ``die_in_update`` (shared by the groups a rollback rebuilds) kills a rank in that
    update (counted from 1 over the run), as a lost rank surfaces: an :class:`ActorLost`."""

    def __init__(self, log: list[tuple], version: int, die_in_update: list[int]) -> None:
        self.log, self.version, self.die_in_update = log, version, die_in_update

    def weights_for_sync(self) -> tuple[str, int]:
        return ("weights", self.version)

    def train_on(self, trajectories, rows, advantages, rag=None) -> dict[str, float]:
        self.log.append(("policy_update", self.version + 1, tuple(trajectories), rag))
        if len(events(self.log, "policy_update")) in self.die_in_update:
            self.log.append(("rank_died",))
            raise ActorLost("policy learner ranks (train): actor died")
        self.version += 1
        return {"loss": 0.0, **dict.fromkeys(FORWARD_COUNTS, 0.0)}

    def save(self, directory) -> None:
        pass

    def shutdown(self, graceful: bool = True) -> None:
        if not graceful:  # after a rank died: the group is ended without asking its ranks to leave
            self.log.append(("ranks_killed",))


class FakeGraph(Graph):
    """A :class:`Graph` whose roles are the fakes; its learners start from a checkpoint's versions, as the real
    ones load them."""

    def __init__(self, config: Config, die_in_update: list[int]) -> None:
        super().__init__(config)
        self.log: list[tuple] = []
        self.die_in_update = die_in_update

    @classmethod
    def start(cls, config: Config, latest: Path | None, die_in_update: tuple[int, ...] = ()) -> FakeGraph:
        graph = cls(config, list(die_in_update))
        graph.start_learners(latest)
        graph.samplers = FakeSamplers(graph.log, graph.serving)
        return graph

    def start_learners(self, latest: Path | None) -> None:
        manifest = load_manifest(latest) if latest is not None else None
        self.adapter = None
        if self.config.algorithm.train_policy:
            policy = manifest.policy_version if manifest else 0
            self.learner = FakePolicyLearner(self.log, policy, self.die_in_update)
        self.retriever_learner = FakeRetrieverLearner(self.log, manifest.retriever_version if manifest else 0)


def coordinator(tmp_path: Path, *overrides: str, die_in_update: tuple[int, ...] = ()) -> Coordinator:
    config = job_config(tmp_path / "run", f"retrieval.index.dir={tmp_path / 'no-index'}", "run.rounds=3",
                        f"rollout.questions_per_batch={2 * SAMPLERS}", "telemetry.wandb_mode=disabled", *overrides)
    return Coordinator(config, start_graph=lambda c, latest: FakeGraph.start(c, latest, die_in_update))


def events(log: list[tuple], *kinds: str) -> list[tuple]:
    return [e for e in log if e[0] in kinds]


def rollout_versions(log: list[tuple]) -> list[tuple[int, int]]:
    """(policy, retriever) versions each round's rollouts were generated with, one entry per round."""
    rollouts = events(log, "rollout")
    return [(e[3], e[4]) for e in rollouts[::SAMPLERS]]


def test_synchronous_rounds_update_the_retriever_then_the_policy_and_sync_before_the_next_rollout(tmp_path):
    c = coordinator(tmp_path)
    try:
        assert c.run() == 3
    finally:
        c.shutdown()
    log = c.graph.log
    kinds = [e[0] for e in log]
    one_round = ["rollout"] * SAMPLERS + ["score"] * SAMPLERS + ["retriever_update"] + ["set_adapter"] * SAMPLERS + [
        "policy_update"] + ["update_policy"] * SAMPLERS
    assert kinds == one_round * 3
    assert rollout_versions(log) == [(0, 0), (1, 1), (2, 2)]  # every round samples the newest policy and adapter
    for update, policy in zip(events(log, "retriever_update"), events(log, "policy_update"), strict=True):
        assert update[2] == policy[2], "the retriever and the policy update on the same rollouts"
    phases = [r.phase for r in read_phases(c.run_dir / "phases.jsonl") if r.round == 0]
    assert phases == ["rollout", "reward", "score", "retriever_update", "policy_update", "sync"]


@pytest.mark.parametrize("candidates", ["logged", "own"])
def test_two_state_updates_eta_star_on_the_logged_or_its_own_scored_candidates(tmp_path, candidates):
    """own: after η_γ's update the learner retrieves η*'s top k share by share, the sampler of each share scores
    them, η*'s update gets those scores and the policy's −γ∇θ L_RAG(θ, η*) term their groups, not the logged."""
    c = coordinator(tmp_path, "algorithm.estimator=two_state", f"algorithm.two_state.candidates={candidates}")
    try:
        figures = c.run_round()
    finally:
        c.shutdown()
    log = c.graph.log
    [update], [lower], [policy] = (events(log, kind) for kind in ("retriever_update", "lower_update", "policy_update"))
    rag = policy[3]
    assert rag.estimator == "two_state" and rag.lower == ("lower_rows", 1)
    assert rag.groups == [("groups", t) for t in update[2]], "η_γ's term: the logged candidates"
    [record] = [r for r in read_phases(c.run_dir / "phases.jsonl") if r.phase == "lower_retriever_update"]
    if candidates == "logged":
        assert lower == ("lower_update", None) and rag.lower_groups is None
        assert not events(log, "own_candidates") and len(events(log, "score")) == SAMPLERS
        assert "own_scored" not in record.info and "lower_retriever/own_scored" not in figures
        return
    own = [("own", share, 1) for share in range(SAMPLERS)]
    assert events(log, "own_candidates") == [("own_candidates", share, 1) for share in range(SAMPLERS)]
    assert events(log, "score")[SAMPLERS:] == [("score", share, own[share]) for share in range(SAMPLERS)]
    assert lower == ("lower_update", [("answer_logp", o) for o in own])
    assert rag.lower_groups == [("groups", o) for o in own] != rag.groups
    kinds = [e[0] for e in log]
    assert kinds.index("retriever_update") < kinds.index("own_candidates") < kinds.index("lower_update") < kinds.index(
        "policy_update")
    assert record.info["own_scored"] == figures["lower_retriever/own_scored"] == TURNS * SAMPLERS
    assert "own_score_seconds" in record.info, "the extra scoring's share of the phase"


def test_async_depth_one_keeps_one_batch_in_flight_within_the_staleness_bound(tmp_path):
    c = coordinator(tmp_path, "rollout.max_staleness=1")
    try:
        figures = [c.run_round() for _ in range(3)]
        assert len(c.pipeline.syncs) == 1, "the last round's sync is not waited for until the run ends"
        c.run()
        assert not c.pipeline.syncs
    finally:
        c.shutdown()
    kinds = [e[0] for e in c.graph.log]
    rollouts = [i for i, kind in enumerate(kinds) if kind == "rollout"]
    assert len(rollouts) == 3 * SAMPLERS, "no batch is drawn beyond the run's last round"
    # round 1's batch is sent with round 0's, before round 0's updates; round 2's after round 0's sync was sent
    assert rollouts[2 * SAMPLERS - 1] < kinds.index("retriever_update")
    assert rollouts[2 * SAMPLERS] > kinds.index("update_policy")
    assert rollout_versions(c.graph.log) == [(0, 0), (0, 0), (1, 1)]
    assert [f["staleness/policy"] for f in figures] == [0, 1, 1]
    assert [f["staleness/retriever"] for f in figures] == [0, 1, 1]


def test_async_depth_two_samples_two_versions_behind(tmp_path):
    c = coordinator(tmp_path, "rollout.max_staleness=2", "run.rounds=4")
    try:
        figures = [c.run_round() for _ in range(4)]
    finally:
        c.shutdown()
    assert rollout_versions(c.graph.log) == [(0, 0), (0, 0), (0, 0), (1, 1)]
    assert [f["staleness/policy"] for f in figures] == [0, 1, 2, 2]


def test_a_share_sent_again_to_a_revived_sampler_is_primed_and_scored_again(tmp_path):
    c = coordinator(tmp_path)
    try:
        c.run_round()
        c.graph.samplers.die_in_rollout = 1
        figures = c.run_round()
    finally:
        c.shutdown()
    log = c.graph.log
    died = log.index(("revived", 1))
    # round 1's shares and their scoring were sent; sampler 1 died in its rollout and is revived serving round
    # 1's adapter and weights before its share (same seed) is generated again
    assert [e[:2] for e in log[died - 4: died]] == [("rollout", 0), ("rollout", 1), ("score", 0), ("score", 1)]
    assert log[died + 1: died + 3] == [("set_adapter", 1, 1), ("update_policy", 1, 1)]
    resent = log[died + 3]
    assert resent == ("rollout", 1, log[died - 3][2], 1, 1)
    fresh = ("trajectories", 1, resent[2], died + 4)
    [score] = events(log[died:], "score")
    assert score == ("score", 1, fresh), "the share sent again is scored again from its new trajectories"
    [retriever] = events(log[died:], "retriever_update")
    [policy] = events(log[died:], "policy_update")
    assert retriever[2][1] == policy[2][1] == fresh and retriever[3][1] == ("answer_logp", fresh)
    assert figures["faults/samplers_revived"] == 1


def test_a_share_drawn_ahead_and_sent_again_is_scored_again_under_async(tmp_path):
    c = coordinator(tmp_path, "rollout.max_staleness=1")
    try:
        c.run_round()  # draws round 1's batch ahead
        c.graph.samplers.die_in_rollout = 0
        figures = c.run_round()
    finally:
        c.shutdown()
    log = c.graph.log
    died = log.index(("revived", 0))
    assert log[died + 1: died + 3] == [("set_adapter", 0, 1), ("update_policy", 0, 1)], "primed with the newest"
    resent = log[died + 3]
    assert resent[:2] == ("rollout", 0) and resent[3:] == (1, 1)
    fresh = ("trajectories", 0, resent[2], died + 4)
    assert ("score", 0, fresh) in log[died:], "the share sent again is scored again from its new trajectories"
    assert figures["faults/samplers_revived"] == 1 and figures["staleness/policy"] == 1


def rolled_back(tmp_path: Path, *overrides: str) -> tuple[list[tuple], list]:
    """A 3-round run whose policy learner dies in its second update (round 1), checkpointing every round."""
    c = coordinator(tmp_path, "checkpoint.every_rounds=1", *overrides, die_in_update=(2,))
    try:
        assert c.run() == 3
        assert c.state()["policy_version"] == 3 and c.state()["retriever_version"] == 3
    finally:
        c.shutdown()
    return c.graph.log, read_phases(c.run_dir / "phases.jsonl")


def test_a_learner_death_rolls_back_to_the_last_checkpoint_and_redoes_the_round(tmp_path):
    log, phases = rolled_back(tmp_path)
    killed = log.index(("ranks_killed",))
    # the samplers serve the checkpoint's adapter and weights (round 1's start: v1) before the round is redone
    assert log[killed + 1: killed + 5] == [("set_adapter", 0, 1), ("set_adapter", 1, 1), ("update_policy", 0, 1),
                                           ("update_policy", 1, 1)]
    seeds = [e[2] for e in events(log, "rollout")]
    assert len(seeds) == 4 * SAMPLERS and seeds[SAMPLERS: 2 * SAMPLERS] == seeds[2 * SAMPLERS: 3 * SAMPLERS]
    assert rollout_versions(log) == [(0, 0), (1, 1), (1, 1), (2, 2)]
    assert [e[1] for e in events(log, "policy_update")] == [1, 2, 2, 3]
    [recover] = [r for r in phases if r.phase == "recover"]
    assert recover.round == 1 and recover.info["restored_round"] == 1


def test_a_rollback_under_async_draws_the_dropped_batches_again_with_their_seeds(tmp_path):
    log, _ = rolled_back(tmp_path, "rollout.max_staleness=1")
    rollouts = events(log, "rollout")
    # rounds 0 and 1 drawn together, round 2 drawn ahead in round 1, which died; rounds 1 and 2 drawn again
    assert len(rollouts) == 5 * SAMPLERS
    seeds = [[e[2] for e in rollouts[i: i + SAMPLERS]] for i in range(0, len(rollouts), SAMPLERS)]
    assert seeds[3:] == seeds[1:3], "the redone rounds sample from the seeds they were first drawn with"
    assert rollout_versions(log)[3:] == [(1, 1), (1, 1)], "both drawn after the samplers serve the checkpoint"


def test_rounds_between_retriever_updates_score_nothing(tmp_path):
    c = coordinator(tmp_path, "algorithm.retriever.update_period=2")
    try:
        c.run()
    finally:
        c.shutdown()
    log = c.graph.log
    assert [e[1] for e in events(log, "retriever_update")] == [1, 2]  # in rounds 0 and 2
    assert len(events(log, "score")) == 2 * SAMPLERS
    assert rollout_versions(log) == [(0, 0), (1, 1), (2, 1)]


def test_a_frozen_policy_has_no_learner_and_its_checkpoints_hold_a_copy_of_the_policy(tmp_path):
    source = tmp_path / "policy-source"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "gemma3_text"}')
    (source / "model.safetensors").write_bytes(bytes(range(256)))
    c = coordinator(tmp_path, "algorithm.train_policy=false", f"policy.model={source}", "checkpoint.every_rounds=2")
    try:
        assert c.run() == 3
        assert c.graph.learner is None
    finally:
        c.shutdown()
    log = c.graph.log
    assert not events(log, "policy_update", "update_policy"), "nothing trains or pushes the policy"
    assert rollout_versions(log) == [(0, 0), (0, 1), (0, 2)]
    phases = [r.phase for r in read_phases(c.run_dir / "phases.jsonl") if r.round == 0]
    assert phases == ["rollout", "reward", "score", "retriever_update", "sync"]
    checkpoints = CheckpointManager(c.run_dir / "checkpoints", 10).checkpoints()
    assert [p.name for p in checkpoints] == ["round-00000002", "round-00000003"]
    for checkpoint in checkpoints:
        copied = checkpoint / POLICY_DIR
        assert sorted(p.name for p in copied.iterdir()) == ["config.json", "model.safetensors"]
        assert (copied / "model.safetensors").read_bytes() == bytes(range(256))
        assert load_manifest(checkpoint).policy_version == 0


@pytest.mark.parametrize(("kl_coef", "updates"), [(0.0, 0), (0.1, 3)])
def test_dynamic_sampling_without_a_mixed_group_has_no_policy_update_unless_a_kl_term_remains(
    tmp_path, kl_coef, updates
):
    """Every group flat: every advantage is 0, so without a KL (or L_RAG) term the update's gradient is 0 and the
    round has no policy update; with one the policy trains on all rows, the KL term alone."""
    c = coordinator(tmp_path, "rollout.dynamic_sampling=true", f"algorithm.grpo.kl_coef={kl_coef}")
    c.graph.samplers.flat = True
    try:
        assert c.run() == 3
    finally:
        c.shutdown()
    log = c.graph.log
    assert len(events(log, "policy_update")) == updates
    assert len(events(log, "retriever_update")) == 3, "the retriever still learns from every round"
    assert rollout_versions(log) == [(0, 0), (min(updates, 1), 1), (min(updates, 2), 2)]
    phases = [r.phase for r in read_phases(c.run_dir / "phases.jsonl") if r.round == 0]
    assert ("policy_update" in phases) == bool(updates)
