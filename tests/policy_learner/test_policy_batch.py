import pytest
import torch
from learner_fixtures import make_policy_batch, tiny_gemma3

from bridge_ray.policy_learner.batch import PolicyBatch
from bridge_ray.policy_learner.objective import sequence_log_probs


@pytest.fixture(scope="module")
def batch():
    b = make_policy_batch(tiny_gemma3(), questions=5, rollouts=2)
    # Tag every row by its advantage so that rows can be traced through the slicing.
    return PolicyBatch(**{**b.__dict__, "advantages": torch.arange(b.num_rows, dtype=torch.float32)})


def test_mini_batches_keep_question_groups_whole_and_cover_every_row(batch):
    minis = batch.mini_batches(2, torch.Generator().manual_seed(3))
    assert [m.num_questions for m in minis] == [2, 2, 1]
    seen = torch.cat([m.advantages for m in minis]).sort().values
    assert torch.equal(seen, batch.advantages)
    for m in minis:  # every question of a mini-batch comes with all its rollouts
        for q in m.question_index.unique():
            assert int((m.question_index == q).sum()) == 2
    again = batch.mini_batches(2, torch.Generator().manual_seed(3))
    assert all(torch.equal(a.question_index, b.question_index) for a, b in zip(minis, again, strict=True))


@pytest.mark.parametrize("by_length", [True, False], ids=["length-buckets", "row-order"])
@pytest.mark.parametrize(("ranks", "micro"), [(1, 4), (2, 1), (3, 2), (4, 3)])
def test_shards_cover_each_row_once_and_pad_with_zero_weight_rows(batch, ranks, micro, by_length):
    weighted = batch.with_token_weights("turn-mean")
    shards = weighted.shard(ranks, micro, by_length)
    assert len(shards) == ranks and len({len(s) for s in shards}) == 1, "same micro-batch count on every rank"
    real, total_weight = [], 0.0
    for micro_batches in shards:
        for m in micro_batches:
            assert 1 <= m.num_rows <= micro
            real += m.advantages[m.token_weights.sum(dim=1) > 0].tolist()
            total_weight += float(m.token_weights.sum())
    assert sorted(real) == batch.advantages.tolist(), "each real row exactly once"
    assert total_weight == pytest.approx(1.0)


def test_length_buckets_pad_less_fill_with_the_shortest_row_and_cut_alike_every_time():
    mixed = make_policy_batch(tiny_gemma3(), questions=4, rollouts=2, length=48, shortest=7).select(torch.arange(7))
    weighted = mixed.with_token_weights("turn-mean")

    def fed(shards):
        return sum(m.input_ids.numel() for micro_batches in shards for m in micro_batches)

    buckets, row_order = weighted.shard(2, 2), weighted.shard(2, 2, by_length=False)
    assert fed(buckets) < fed(row_order)
    lengths = [m.attention_mask.sum(dim=1).tolist() for micro_batches in buckets for m in micro_batches]
    shortest = int(mixed.attention_mask.sum(dim=1).min())
    # rank r's micro-batch j holds the sorted rows 4j + 2r, 4j + 2r + 1: the filler row is the last, a short one
    in_step_order = sorted((n for run in lengths for n in run), reverse=True)
    assert lengths == [in_step_order[i : i + 2] for i in (0, 4, 2, 6)]
    assert lengths[-1][-1] == shortest and float(buckets[1][1].token_weights[-1].sum()) == 0
    again = weighted.shard(2, 2)
    assert all(torch.equal(a.input_ids, b.input_ids) for x, y in zip(buckets, again, strict=True)
               for a, b in zip(x, y, strict=True))


def test_token_weights_of_a_mini_batch_sum_to_one():
    b = make_policy_batch(tiny_gemma3()).with_token_weights("turn-mean")
    assert float(b.token_weights.sum()) == pytest.approx(1.0)
    assert (b.token_weights[b.action_mask == 0] == 0).all()
    with pytest.raises(ValueError, match="with_token_weights first"):
        make_policy_batch(tiny_gemma3()).shard(2, 1)


def test_left_padding_and_trimming_do_not_change_log_probs():
    model = tiny_gemma3()
    b = make_policy_batch(model, questions=1, rollouts=2)
    full = sequence_log_probs(model, b)[0]
    pad = 3  # the same rows behind 3 left-padding tokens: positions must still start at 0

    def left(t, value=0):
        return torch.nn.functional.pad(t, (pad, 0), value=value)

    padded = PolicyBatch(
        input_ids=left(b.input_ids, value=7),
        attention_mask=left(b.attention_mask),
        action_mask=left(b.action_mask),
        old_logp=left(b.old_logp),
        turn_ids=left(b.turn_ids),
        advantages=b.advantages,
        question_index=b.question_index,
    )
    mask = b.action_mask.bool()
    assert torch.allclose(sequence_log_probs(model, padded)[0][:, pad:][mask], full[mask], atol=1e-5)
    trimmed = padded.trimmed()
    assert trimmed.input_ids.shape[1] == int(b.attention_mask.sum(dim=1).max()), "padding columns dropped"
    assert torch.allclose(sequence_log_probs(model, trimmed)[0][trimmed.action_mask.bool()], full[mask], atol=1e-5)


def test_bad_batches_are_rejected_with_the_field_named():
    b = make_policy_batch(tiny_gemma3())
    fields = b.__dict__
    with pytest.raises(ValueError, match=r"PolicyBatch\.old_logp has shape"):
        PolicyBatch(**{**fields, "old_logp": b.old_logp[:, :-1]})
    with pytest.raises(ValueError, match=r"PolicyBatch\.advantages has shape"):
        PolicyBatch(**{**fields, "advantages": b.advantages[:-1]})
    first = b.action_mask.clone()
    first[0, 0] = 1
    with pytest.raises(ValueError, match="first column"):
        PolicyBatch(**{**fields, "action_mask": first})
    padded = b.attention_mask.clone()
    padded[0, 4] = 0
    with pytest.raises(ValueError, match="pads out"):
        PolicyBatch(**{**fields, "attention_mask": padded})
    bad = b.old_logp.clone()
    bad[0, 4] = float("nan")
    with pytest.raises(ValueError, match="old_logp is not finite"):
        PolicyBatch(**{**fields, "old_logp": bad})
