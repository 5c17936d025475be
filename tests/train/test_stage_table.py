"""The per-stage evaluation table that train prints after base, warm-up and RL evaluations."""

import json

from bridge_ray.commands.train import stage_table


def _table(em: float, recall: float | None) -> dict:
    return {"rows": [{"name": "world", "count": 4, "em": em, "f1": em + 1, "cover_em": em, "recall": recall,
                      "multi_hop": False}], "m_avg": None, "avg": em}


def test_stages_side_by_side(tmp_path):
    assert stage_table(tmp_path) is None
    (tmp_path / "eval_before.json").write_text(json.dumps(_table(0.0, 50.0)))
    assert stage_table(tmp_path) is None  # one stage: nothing to compare
    (tmp_path / "eval_warmup.json").write_text(json.dumps(_table(40.0, None)))
    (tmp_path / "eval_after.json").write_text(json.dumps(_table(45.5, 60.0)))
    lines = stage_table(tmp_path).splitlines()
    assert lines[0] == "| data set | base EM / F1 / recall | warm-up EM / F1 / recall | after RL EM / F1 / recall |"
    assert lines[2] == "| world | 0.0 / 1.0 / 50.0 | 40.0 / 41.0 / – | 45.5 / 46.5 / 60.0 |"
