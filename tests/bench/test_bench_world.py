"""``bench world``: the gate arithmetic, and both query modes run for real on the small gap world."""

from __future__ import annotations

import json

import pytest
from job_fixtures import tiny_policy_overrides

from bridge_ray.bench.world import gates, recall_at, recall_by_type
from bridge_ray.cli import main


def figures(recall_m, recall_k, frozen=None, oracle=None):
    return {"frozen_recall_at_m": recall_m, "frozen_recall_at_k": recall_k, "frozen_em": frozen, "oracle_em": oracle}


def test_gates_pass_and_fail_at_their_bounds():
    assert gates(figures(30.0, 90.0, 40.0, 55.0)) == {
        "frozen_recall_at_m_in_30_60": True, "frozen_recall_at_k_at_least_90": True,
        "oracle_em_minus_frozen_em_at_least_15": True,
    }
    assert gates(figures(60.1, 89.9, 40.0, 54.9)) == {
        "frozen_recall_at_m_in_30_60": False, "frozen_recall_at_k_at_least_90": False,
        "oracle_em_minus_frozen_em_at_least_15": False,
    }
    assert not gates(figures(29.9, 100.0))["frozen_recall_at_m_in_30_60"]
    assert gates(figures(45.0, 95.0))["oracle_em_minus_frozen_em_at_least_15"] is None  # no policy, no EM


def test_recall_counts_gold_passages_found_by_any_search_of_their_question():
    gold = [["1"], ["2", "3"]]
    searched = [[["9", "1", "8"]], [["2", "7", "6"], ["5", "4", "3"]]]
    assert recall_at(gold, searched, 1) == pytest.approx(100 * 1 / 3)
    assert recall_at(gold, searched, 2) == pytest.approx(100 * 2 / 3)
    assert recall_at(gold, searched, 3) == 100.0
    assert recall_at([["1"]], [[]], 3) == 0.0  # a question the policy never searched


def test_recall_splits_by_type_and_two_hop_questions_by_hop():
    """A second hop searched for the wrong entity is missed at any depth; the first hop was found."""
    types = ["single", "two_hop", "two_hop"]
    gold = [["1"], ["2", "3"], ["4", "5"]]
    searched = [[["9", "1"]], [["2", "7"], ["8", "6"]], [["7", "4"], ["5", "8"]]]
    rows = recall_by_type(types, gold, searched, 1, 2)
    assert rows["single"] == {"questions": 1, "recall_at_m": 0.0, "recall_at_k": 100.0}
    assert rows["two_hop"] == {"questions": 2, "recall_at_m": 50.0, "recall_at_k": 75.0}
    assert rows["two_hop/hop1"] == {"questions": 2, "recall_at_m": 50.0, "recall_at_k": 100.0}
    assert rows["two_hop/hop2"] == {"questions": 2, "recall_at_m": 50.0, "recall_at_k": 50.0}
    assert list(rows) == ["single", "two_hop", "two_hop/hop1", "two_hop/hop2"]


@pytest.fixture(scope="module")
def gap_cache(tmp_path_factory):
    """One cache for the module: the small gap world's index is built once (about a minute on 2 cores)."""
    return tmp_path_factory.mktemp("gap-cache")


@pytest.mark.slow
def test_gold_queries_on_the_small_gap_world(tmp_path, monkeypatch, capsys, gap_cache):
    """Builds the small gap world's index with the real MiniLM."""
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(gap_cache))
    out = tmp_path / "world.json"
    rc = main(["bench", "world", "--world", "gap", "--queries", "gold", "--out", str(out),
               "data.world_size=small", "retrieval.index.num_shards=1"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert (result["world"], result["queries"], result["split"], result["questions"], result["m"], result["k"]) == (
        "gap", "gold", "test", 20, 3, 8)
    assert result["frozen_em"] is None and result["oracle_em"] is None
    assert 0 <= result["frozen_recall_at_m"] <= result["frozen_recall_at_k"] <= 100
    assert result["frozen_recall_at_k"] >= 80  # the entity's name reaches its passages
    assert result["frozen_recall_at_m"] < result["frozen_recall_at_k"]  # the jargon does not rank them
    assert result["gates"] == gates(result)
    assert sum(row["questions"] for group, row in result["by_type"].items() if "/" not in group) == 20
    printed = capsys.readouterr().out
    assert "gap world, test split, 20 questions" in printed and "gate frozen recall@3 in [30, 60]" in printed
    dev = tmp_path / "dev.json"  # settings are chosen on dev: another question set, the same index
    assert main(["bench", "world", "--world", "gap", "--queries", "gold", "--split", "dev", "--out", str(dev),
                 "data.world_size=small", "retrieval.index.num_shards=1"]) == 0
    assert json.loads(dev.read_text())["split"] == "dev" and "gap world, dev split" in capsys.readouterr().out


@pytest.mark.slow
def test_policy_queries_measure_frozen_and_oracle_em(tmp_path, monkeypatch, tiny_policy, gap_cache):
    """The warm-up policy's own searches (the tiny Gemma, warmed up for a few steps): both EMs are measured."""
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(gap_cache))
    out = tmp_path / "world.json"
    rc = main(["bench", "world", "--world", "gap", "--max-questions", "3", "--out", str(out),
               *tiny_policy_overrides(tiny_policy), "data.world_size=small", "retrieval.index.num_shards=1",
               "warmup.examples=2", "warmup.epochs=1", "warmup.batch_size=1", "rollout.max_turns=1",
               "rollout.max_action_length=16", "policy.prompt_template=bridge_ray/agent/templates/zero_shot.txt"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert (result["queries"], result["questions"]) == ("policy", 3)
    assert 0 <= result["frozen_em"] <= 100 and 0 <= result["oracle_em"] <= 100
    assert isinstance(result["gates"]["oracle_em_minus_frozen_em_at_least_15"], bool)
