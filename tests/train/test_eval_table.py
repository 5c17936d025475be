import json

import pytest

from bridge_ray.evaluation.table import QuestionOutcome, combined, summarize


def q(em, f1=None, cover=None, recall=None, type=None):
    return QuestionOutcome(em, em if f1 is None else f1, em if cover is None else cover, recall, type)


def test_paper_layout_averages():
    table = summarize({
        "nq": [q(1), q(0)],                      # 50
        "hotpotqa": [q(1), q(1), q(0), q(0)],    # 50
        "musique": [q(0, f1=0.5)],               # 0
        "bamboogle": [q(1)],                     # 100
    })
    ems = {r.name: r.em for r in table.rows}
    assert ems == {"nq": 50.0, "hotpotqa": 50.0, "musique": 0.0, "bamboogle": 100.0}
    assert table.m_avg == pytest.approx(50.0) and table.avg == pytest.approx(50.0)
    assert {r.name: r.f1 for r in table.rows}["musique"] == 50.0
    md = table.to_markdown()
    assert "| hotpotqa | 4 | 50.0 |" in md and "M-Avg." in md
    assert json.loads(table.to_json())["avg"] == pytest.approx(50.0)


def test_typed_world_rows_recall_and_multi_hop_types():
    table = summarize({"world": [
        q(1, recall=1.0, type="single"), q(0, recall=0.5, type="two_hop"), q(1, recall=0.0, type="comparison"),
    ]})
    rows = {r.name: r for r in table.rows}
    assert set(rows) == {"world", "world/single", "world/two_hop", "world/comparison"}
    assert rows["world"].recall == pytest.approx(50.0) and rows["world/two_hop"].em == 0.0
    assert table.m_avg == pytest.approx(50.0)  # mean of two_hop (0) and comparison (100)
    assert table.avg == pytest.approx(200 / 3)
    with pytest.raises(ValueError, match="no evaluated questions"):
        summarize({"empty": []})


def test_combined_tables_average_afresh_as_if_summarized_together():
    gap = {"gap": [q(1, recall=1.0, type="single"), q(0, recall=0.0, type="two_hop")]}
    world = {"world": [q(1, type="two_hop"), q(1, type="comparison"), q(0, type="single")],
             "hotpotqa": [q(0), q(1)]}
    table = combined([summarize(gap), summarize(world)])
    together = summarize(gap | world)
    assert [r.name for r in table.rows] == [r.name for r in together.rows]
    assert (table.m_avg, table.avg) == pytest.approx((together.m_avg, together.avg))
    assert table.m_avg == pytest.approx((0 + 100 + 100 + 50) / 4)  # gap/two_hop, world's two types, hotpotqa
    assert table.avg == pytest.approx((50 + 200 / 3 + 50) / 3)
    assert set(table.questions) == {"gap", "world", "hotpotqa"}
