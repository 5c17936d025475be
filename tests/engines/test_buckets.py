from bridge_ray.engines.buckets import FORWARD_TOKENS, least_padding_runs


def test_runs_group_similar_lengths_and_cover_every_row():
    lengths = [100, 1, 100, 2, 100, 1, 100, 3]
    runs = least_padding_runs(lengths, 8)
    assert sorted(i for run in runs for i in run) == list(range(8))
    assert [sorted(lengths[i] for i in run) for run in runs] == [[1, 1, 2, 3], [100] * 4]  # less padding, two forwards
    assert sorted(map(len, least_padding_runs([5] * 8, 3))) == [2, 3, 3]  # never more than max_rows per forward
    assert len(least_padding_runs([1] * 4 + [1 + FORWARD_TOKENS // 8] * 4, 8)) == 1  # too little padding to pay
    assert least_padding_runs([], 4) == []
