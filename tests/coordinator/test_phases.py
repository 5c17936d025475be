import pytest

from bridge_ray.coordinator.phases import (
    POLICY_UPDATE,
    RETRIEVER_UPDATE,
    OrderViolation,
    PhaseRecord,
    PhaseRecorder,
    check_bilevel_order,
    read_phases,
)


def test_recorder_times_phases_with_versions_and_persists(tmp_path):
    versions = [0, 0]
    rec = PhaseRecorder(lambda: tuple(versions), tmp_path / "phases.jsonl")
    with rec.phase(0, RETRIEVER_UPDATE) as info:
        versions[1] += 1
        info["loss"] = 0.5
    with rec.phase(0, POLICY_UPDATE):
        versions[0] += 1
    saved = read_phases(tmp_path / "phases.jsonl")
    assert [(r.phase, r.policy_version, r.retriever_version) for r in saved] == [
        (RETRIEVER_UPDATE, 0, 0), (POLICY_UPDATE, 0, 1)]
    assert saved[0].info == {"loss": 0.5} and saved[0].end <= saved[1].start
    check_bilevel_order(saved)
    assert set(rec.round_seconds(0)) == {RETRIEVER_UPDATE, POLICY_UPDATE}


def test_order_violation_is_detected():
    records = [PhaseRecord(3, POLICY_UPDATE, 1.0, 2.0, 0, 0), PhaseRecord(3, RETRIEVER_UPDATE, 1.5, 2.5, 0, 0)]
    with pytest.raises(OrderViolation, match="round 3"):
        check_bilevel_order(records)


def test_a_redone_round_is_checked_as_its_own_attempt():
    from bridge_ray.coordinator.phases import RECOVER

    failed = [PhaseRecord(1, RETRIEVER_UPDATE, 1.0, 2.0, 1, 1), PhaseRecord(1, POLICY_UPDATE, 3.0, 4.0, 1, 2)]
    redone = [PhaseRecord(1, RECOVER, 4.0, 5.0, 1, 1), PhaseRecord(1, RETRIEVER_UPDATE, 6.0, 7.0, 1, 1)]
    check_bilevel_order([*failed, *redone, PhaseRecord(1, POLICY_UPDATE, 8.0, 9.0, 1, 2)])
    with pytest.raises(OrderViolation, match="round 1"):  # the redo's own policy update came too early
        check_bilevel_order([*failed, *redone, PhaseRecord(1, POLICY_UPDATE, 6.5, 9.0, 1, 2)])


def test_the_recorder_fails_the_round_whose_policy_update_started_inside_the_retriever_update():
    """What the coordinator runs as each round ends, on phases timed by the recorder itself."""
    rec = PhaseRecorder(lambda: (0, 0))
    with rec.phase(0, RETRIEVER_UPDATE):
        pass
    with rec.phase(0, POLICY_UPDATE):
        pass
    rec.check_round(0)
    with rec.phase(1, RETRIEVER_UPDATE), rec.phase(1, POLICY_UPDATE):  # overlapping: the order is broken
        pass
    with pytest.raises(OrderViolation, match=r"round 1: retriever_update ended at .* after policy_update started"):
        rec.check_round(1)
    rec.check_round(0)  # an earlier round stays valid


def test_the_recorder_checks_only_the_attempt_after_a_recovery():
    from bridge_ray.coordinator.phases import RECOVER

    rec = PhaseRecorder(lambda: (0, 0))
    with rec.phase(2, RETRIEVER_UPDATE), rec.phase(2, POLICY_UPDATE):  # the failed attempt
        pass
    with rec.phase(2, RECOVER):
        pass
    with rec.phase(2, RETRIEVER_UPDATE):
        pass
    with rec.phase(2, POLICY_UPDATE):
        pass
    rec.check_round(2)
