"""bench agent's answer-scorer figures: naive and shared-prefix timings alternate, and the JSON holds each ratio."""

import json
import statistics

import pytest

from bridge_ray.cli import main


@pytest.mark.slow  # the real MiniLM encodes the small world's index
def test_scorer_ratios_are_medians_of_alternating_timings(tmp_path, tiny_policy, world_index, capsys):
    out = tmp_path / "agent.json"
    assert main(["bench", "agent", "--backends", "hf", "--repeats", "0", "--ks", "2", "5", "--scorer-repeats", "3",
                 "--out", str(out), f"policy.model={tiny_policy}", f"retrieval.index.dir={world_index}"]) == 0
    scorer = json.loads(out.read_text())["scorer"]
    assert [row["k"] for row in scorer] == [2, 5]
    for row in scorer:
        assert len(row["naive_s"]) == len(row["shared_s"]) == len(row["speedups"]) == 3
        assert row["speedups"] == pytest.approx([n / s for n, s in zip(row["naive_s"], row["shared_s"], strict=True)])
        assert row["speedup"] == statistics.median(row["speedups"])
        assert row["max_abs_diff"] < 1e-4  # the shared-prefix scores are the naive ones
    assert "medians of 3" in capsys.readouterr().out


@pytest.mark.parametrize("flags", [["--scorer-repeats", "0"], ["--ks", "0"], ["--repeats", "-1"]])
def test_counts_below_their_minimum_are_refused(flags, capsys):
    assert main(["bench", "agent", *flags]) == 2
    assert flags[0] in capsys.readouterr().err
