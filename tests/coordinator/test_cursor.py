import pytest
import torch
from job_fixtures import LOCAL_CPU

from bridge_ray.checkpoint import CheckpointManager, Manifest, capture_rng_state, load_manifest
from bridge_ray.config import load_config
from bridge_ray.coordinator.cursor import QuestionCursor, loop_start
from bridge_ray.train.stages import checkpoint_start, stage_config


def test_cursor_covers_each_epoch_once_and_reshuffles():
    cursor = QuestionCursor(num_questions=10, batch_size=3, seed=1)
    epoch0 = [cursor.next_batch() for _ in range(3)]
    flat = [q for b in epoch0 for q in b]
    assert len(set(flat)) == 9 and all(0 <= q < 10 for q in flat)
    nxt = cursor.next_batch()  # only one question left in epoch 0: the batch starts epoch 1
    assert cursor.epoch == 1 and len(set(nxt)) == 3
    assert QuestionCursor(10, 3, seed=1).next_batch() == epoch0[0]
    other_seed = QuestionCursor(10, 3, seed=2)
    assert [other_seed.next_batch() for _ in range(3)] != epoch0


def test_resumed_cursor_draws_what_an_uninterrupted_one_draws():
    straight = QuestionCursor(20, 4, seed=5)
    expected = [straight.next_batch() for _ in range(9)]
    first = QuestionCursor(20, 4, seed=5)
    got = [first.next_batch() for _ in range(4)]
    resumed = QuestionCursor(20, 4, seed=5)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next_batch() for _ in range(5)]
    assert got == expected


def test_cursor_rejects_bad_setups():
    with pytest.raises(ValueError, match="fewer than one batch"):
        QuestionCursor(2, 4)
    cursor = QuestionCursor(10, 2, seed=1)
    with pytest.raises(ValueError, match="seed"):
        cursor.load_state_dict({"epoch": 0, "position": 0, "seed": 2})


def _draw(cursor: QuestionCursor, samplers: int = 2) -> tuple[list[int], list[int]]:
    """A round's draws in the coordinator's order (``Coordinator._draw_batch``): its questions, then one sampling
    seed per sampler from the process's RNG."""
    return cursor.next_batch(), torch.randint(2**31 - 1, (samplers,)).tolist()


def _checkpoint(root, round_index: int, cursor: QuestionCursor):
    """A checkpoint as the coordinator saves it after ``round_index`` rounds: the cursor and the RNG state."""
    manifest = Manifest(round_index, round_index, 0, cursor.state_dict(), capture_rng_state())
    return CheckpointManager(root, keep=1).save(manifest, lambda directory: None)


def test_a_stage_continues_the_question_order_and_seeds_of_the_stage_before_it(tmp_path):
    config = load_config(LOCAL_CPU, [f"run.output_dir={tmp_path}", "run.seed=3",
                                "stages=[{name: a, train: policy, rounds: 2}, {name: b, train: policy, rounds: 3}]"])
    first = stage_config(config, 0, None)
    cursor = loop_start(first, 40, None)
    stage_a = [_draw(cursor) for _ in range(2)]
    end_of_a = _checkpoint(tmp_path / "a", 2, cursor)

    second = stage_config(config, 1, checkpoint_start(end_of_a))
    cursor = loop_start(second, 40, None)
    stage_b = [_draw(cursor) for _ in range(3)]
    assert stage_b[0][0] != stage_a[0][0], "stage b does not retrain on stage a's first questions"
    assert stage_b[0][1] != stage_a[0][1], "nor sample them from its seeds"
    straight = loop_start(first, 40, None)
    assert [_draw(straight) for _ in range(5)] == stage_a + stage_b, "the stages draw what one run of 5 rounds draws"

    # a resumed stage b takes its own checkpoint's state, not its start's
    resumed = loop_start(second, 40, None)
    _draw(resumed)
    cursor = loop_start(second, 40, load_manifest(_checkpoint(tmp_path / "b", 1, resumed)))
    assert [_draw(cursor) for _ in range(2)] == stage_b[1:]
