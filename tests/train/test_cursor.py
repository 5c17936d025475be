import pytest

from bridge_ray.train.cursor import QuestionCursor


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
