"""The round pipeline alone: what is drawn ahead at each depth, when a sync is confirmed, and the cursor a
checkpoint records (the coordinator's unit test runs it inside whole rounds)."""

from __future__ import annotations

from bridge_ray.coordinator.pipeline import RoundBatch, RoundPipeline


def pipeline(depth: int, rounds: int = 4) -> tuple[RoundPipeline[str], list[str]]:
    log: list[str] = []

    def draw(r: int) -> RoundBatch:
        log.append(f"draw {r}")
        return RoundBatch({"position": r}, {"rng": r}, [], [], [], [], 0.0)

    return RoundPipeline(depth, rounds, draw, lambda sync: log.append(f"confirm {sync}")), log


def run(p: RoundPipeline[str], log: list[str], rounds: range) -> None:
    for r in rounds:
        assert p.next_batch(r).cursor_state == {"position": r}
        log.append(f"train {r}")
        p.sent(f"sync {r}")


def test_depth_zero_draws_each_batch_in_its_round_and_confirms_each_sync_at_once():
    p, log = pipeline(0, rounds=2)
    run(p, log, range(2))
    assert log == ["draw 0", "train 0", "confirm sync 0", "draw 1", "train 1", "confirm sync 1"]
    assert p.drawn_from() is None


def test_depth_two_keeps_two_batches_ahead_and_two_syncs_unconfirmed_until_the_end():
    p, log = pipeline(2, rounds=4)
    run(p, log, range(4))
    assert log == ["draw 0", "draw 1", "draw 2", "train 0", "draw 3", "train 1", "train 2", "confirm sync 0",
                   "train 3", "confirm sync 1"], "no batch is drawn for a round at or past the run's last"
    p.drain()
    assert log[-2:] == ["confirm sync 2", "confirm sync 3"] and not p.syncs


def test_a_checkpoint_records_the_cursor_from_before_the_first_batch_ahead():
    p, log = pipeline(1)
    run(p, log, range(2))
    assert p.drawn_from() == ({"position": 2}, {"rng": 2})


def test_a_rollback_drops_what_is_in_flight_and_draws_again_from_the_restored_round():
    p, log = pipeline(1)
    run(p, log, range(2))
    p.drop()
    assert p.drawn_from() is None and not p.syncs
    del log[:]
    run(p, log, range(1, 2))
    assert log == ["draw 1", "draw 2", "train 1"], "the dropped syncs are never confirmed"
