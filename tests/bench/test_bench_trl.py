"""bench trl at its smallest: both sides run a step and the JSON holds their times and their ratio."""

import json

import pytest

from bridge_ray.cli import main

pytestmark = pytest.mark.slow  # loads the tiny policy twice (TRL and ours) and imports TRL and DeepSpeed


def test_writes_both_step_times_and_their_ratio(tmp_path, capsys):
    out = tmp_path / "trl.json"
    assert main(["bench", "trl", "--prompts", "1", "--group-size", "2", "--prompt-tokens", "4",
                 "--completion-tokens", "2", "--micro-batch-size", "2", "--untimed", "0", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["ours_s"] > 0 and results["trl_s"] > 0
    assert results["speedup"] == pytest.approx(results["trl_s"] / results["ours_s"])
    assert set(results["phases"]["ours"]) == {"generate_score_s", "update_s", "sync_s", "step_s", "step_cpu_s"}
    assert set(results["phases"]["trl"]) == {"generate_score_s", "update_s", "step_s", "step_cpu_s"}
    assert "speedup (TRL step / our step)" in capsys.readouterr().out
