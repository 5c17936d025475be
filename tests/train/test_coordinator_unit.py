"""The coordinator's round logic driven through fake role handles, without Ray: the bilevel order, the async
depth and a share sent again to a revived sampler, in seconds.

The fakes stand in for the typed handles (``SamplerGroup``, ``RetrieverLearnerGroup``, ``PolicyLearnerGroup``)
and answer with the same named bundles, whose "refs" are plain values. A fake actor runs a call when it is
sent, which is the order a real actor runs its calls in (one queue per actor), and logs it with the versions
it serves then. The coordinator's own checks (complete groups, the staleness bound, the bilevel order of
``phases.jsonl``) run as in a real run. The end-to-end tests (tests/train/test_training_job.py,
test_fault_tolerance.py, test_exact_resume.py) run the same rounds on real actors.
"""

from __future__ import annotations

from pathlib import Path

from job_fixtures import job_config

from bridge_ray.config import Config
from bridge_ray.policy.learner import FORWARD_COUNTS
from bridge_ray.retriever.handle import LowerUpdateRefs, RetrieverUpdateRefs
from bridge_ray.retriever.learner import RetrieverLearner
from bridge_ray.rollout.handle import RolloutRefs, ScoreRefs, Serving
from bridge_ray.rollout.sampler import Sampler
from bridge_ray.rollout.summary import RolloutSummary
from bridge_ray.runtime.actor_group import Call, Collected
from bridge_ray.train.coordinator import Coordinator
from bridge_ray.train.phases import read_phases

SAMPLERS = 2


class FakeSamplers:
    """Two samplers serving (policy, retriever) versions; ``die_in_rollout`` kills one in its next rollout."""

    def __init__(self, log: list[tuple], serving) -> None:
        self.log, self.serving = log, serving
        self.served = [[0, 0] for _ in range(SAMPLERS)]
        self.revived: list[int] = []
        self.die_in_rollout: int | None = None

    def __len__(self) -> int:
        return SAMPLERS

    def versions(self) -> list[tuple[int, int]]:
        return [tuple(s) for s in self.served]

    def rollout(self, index, questions, group_size, seed) -> Call[RolloutRefs]:
        policy, retriever = self.served[index]
        self.log.append(("rollout", index, seed, policy, retriever))
        summaries = [
            RolloutSummary(q.uid, k, float((seed + k) % 2), policy, (retriever,), 8, 4, 2, 0, True, False, None,
                           f"{seed}-{k}")
            for q in questions for k in range(group_size)
        ]
        trajectories = ("trajectories", index, seed, len(self.log))  # a new ref for every call
        return Call(index, Sampler.rollout, (questions, group_size, seed), (summaries, trajectories), RolloutRefs)

    def score(self, rollout: Call[RolloutRefs], with_groups: bool) -> Call[ScoreRefs]:
        trajectories = rollout.out.trajectories
        self.log.append(("score", rollout.index, trajectories))
        groups = ("groups", trajectories) if with_groups else None
        refs = (len(rollout.refs[0]), ("answer_logp", trajectories), groups)
        return Call(rollout.index, Sampler.score, (trajectories, with_groups), refs, ScoreRefs)

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
    def __init__(self, log: list[tuple]) -> None:
        self.log, self.version = log, 0

    def adapter(self) -> tuple[str, int]:
        return ("adapter", self.version)

    def update(self, trajectories, answer_logp, advantages) -> Call[RetrieverUpdateRefs]:
        self.version += 1
        self.log.append(("retriever_update", self.version, tuple(trajectories), tuple(answer_logp)))
        refs = (({"loss": 0.0}, self.version), ("adapter", self.version), None)
        return Call(0, RetrieverLearner.update, (), refs, RetrieverUpdateRefs)

    def update_lower(self) -> Call[LowerUpdateRefs]:
        raise AssertionError("only the two-state estimator updates eta*")

    def collect(self, calls, what) -> Collected:
        return Collected([call.refs[0] for call in calls], list(calls))

    def save(self, directory: str) -> None:
        pass

    def shutdown(self) -> None:
        pass


class FakePolicyLearner:
    def __init__(self, log: list[tuple]) -> None:
        self.log, self.version = log, 0

    def weights_for_sync(self) -> tuple[str, int]:
        return ("weights", self.version)

    def train_on(self, trajectories, rows, advantages, rag=None) -> dict[str, float]:
        self.version += 1
        self.log.append(("policy_update", self.version, tuple(trajectories)))
        return {"loss": 0.0, **dict.fromkeys(FORWARD_COUNTS, 0.0)}

    def save(self, directory) -> None:
        pass

    def shutdown(self, graceful: bool = True) -> None:
        pass


class FakeGraphCoordinator(Coordinator):
    """The coordinator with its graph replaced by the fakes (what ``_start_actors`` would start on Ray)."""

    def __init__(self, config: Config) -> None:
        self.log: list[tuple] = []
        super().__init__(config)

    def _start_actors(self, config: Config, index: Path, latest: Path | None) -> None:
        self._start_learners(latest)
        self.samplers = FakeSamplers(self.log, self._serving)

    def _start_learners(self, latest: Path | None) -> None:
        self.learner, self.retriever_learner = FakePolicyLearner(self.log), FakeRetrieverLearner(self.log)


def coordinator(tmp_path: Path, *overrides: str) -> FakeGraphCoordinator:
    config = job_config(tmp_path / "run", f"retrieval.index.dir={tmp_path / 'no-index'}", "run.rounds=3",
                        f"rollout.questions_per_batch={2 * SAMPLERS}", *overrides)
    return FakeGraphCoordinator(config)


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
    kinds = [e[0] for e in c.log]
    one_round = ["rollout"] * SAMPLERS + ["score"] * SAMPLERS + ["retriever_update"] + ["set_adapter"] * SAMPLERS + [
        "policy_update"] + ["update_policy"] * SAMPLERS
    assert kinds == one_round * 3
    assert rollout_versions(c.log) == [(0, 0), (1, 1), (2, 2)]  # every round samples the newest policy and adapter
    for update, policy in zip(events(c.log, "retriever_update"), events(c.log, "policy_update"), strict=True):
        assert update[2] == policy[2], "the retriever and the policy update on the same rollouts"
    phases = [r.phase for r in read_phases(c.run_dir / "phases.jsonl") if r.round == 0]
    assert phases == ["rollout", "reward", "score", "retriever_update", "policy_update", "sync"]


def test_async_depth_one_keeps_one_batch_in_flight_within_the_staleness_bound(tmp_path):
    c = coordinator(tmp_path, "rollout.max_staleness=1")
    try:
        figures = [c.run_round() for _ in range(3)]
    finally:
        c.shutdown()
    kinds = [e[0] for e in c.log]
    rollouts = [i for i, kind in enumerate(kinds) if kind == "rollout"]
    assert len(rollouts) == 3 * SAMPLERS, "no batch is drawn beyond the run's last round"
    # round 1's batch is sent with round 0's, before round 0's updates; round 2's after round 0's sync was sent
    assert rollouts[2 * SAMPLERS - 1] < kinds.index("retriever_update")
    assert rollouts[2 * SAMPLERS] > kinds.index("update_policy")
    assert rollout_versions(c.log) == [(0, 0), (0, 0), (1, 1)]
    assert [f["staleness/policy"] for f in figures] == [0, 1, 1]
    assert [f["staleness/retriever"] for f in figures] == [0, 1, 1]


def test_a_share_sent_again_to_a_revived_sampler_is_primed_and_scored_again(tmp_path):
    c = coordinator(tmp_path)
    try:
        c.run_round()
        c.samplers.die_in_rollout = 1
        figures = c.run_round()
    finally:
        c.shutdown()
    died = c.log.index(("revived", 1))
    # round 1's shares and their scoring were sent; sampler 1 died in its rollout and is revived serving round
    # 1's adapter and weights before its share (same seed) is generated again
    assert [e[:2] for e in c.log[died - 4: died]] == [("rollout", 0), ("rollout", 1), ("score", 0), ("score", 1)]
    assert c.log[died + 1: died + 3] == [("set_adapter", 1, 1), ("update_policy", 1, 1)]
    resent = c.log[died + 3]
    assert resent == ("rollout", 1, c.log[died - 3][2], 1, 1)
    fresh = ("trajectories", 1, resent[2], died + 4)
    [score] = events(c.log[died:], "score")
    assert score == ("score", 1, fresh), "the share sent again is scored again from its new trajectories"
    [retriever] = events(c.log[died:], "retriever_update")
    [policy] = events(c.log[died:], "policy_update")
    assert retriever[2][1] == policy[2][1] == fresh and retriever[3][1] == ("answer_logp", fresh)
    assert figures["faults/samplers_revived"] == 1


def test_rounds_between_retriever_updates_score_nothing(tmp_path):
    c = coordinator(tmp_path, "algorithm.retriever.update_period=2")
    try:
        c.run()
    finally:
        c.shutdown()
    assert [e[1] for e in events(c.log, "retriever_update")] == [1, 2]  # in rounds 0 and 2
    assert len(events(c.log, "score")) == 2 * SAMPLERS
    assert rollout_versions(c.log) == [(0, 0), (1, 1), (2, 1)]
