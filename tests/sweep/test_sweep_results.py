"""A sweep's report: mean ± std over seeds, per type, the oracle arm, the paired differences and the files written
(from synthetic results)."""

import json

import pytest

from bridge_ray.evaluation.paired import QUESTION_LEVEL, TWO_LEVEL
from bridge_ray.sweep.paired import final_questions, paired_rows
from bridge_ray.sweep.results import point, read_results, results_markdown, write_results


def _table(name: str, em: float) -> dict:
    rows = [{"name": name, "em": em, "f1": em, "recall": 90.0},
            {"name": f"{name}/two_hop", "em": em - 10, "f1": em - 10, "recall": 80.0}]
    return {"rows": rows}


def _results() -> dict:
    curve = [point(p, s, r, name, _table(name, 50 + 5 * r + s + (3 if p == "bridge" else 0)))
             for p in ("fixed", "bridge") for s in (0, 1) for r in (0, 4) for name in ("world", "ood")]
    rounds = [{"preset": p, "seed": s, "round": r, "reward": 0.5 + 0.1 * r, "zero_variance_groups": 0.5}
              for p in ("fixed", "bridge") for s in (0, 1) for r in (1, 2, 3, 4)]
    curve += [point("oracle", None, 0, name, _table(name, 85.0)) for name in ("world", "ood")]
    return {"presets": {"fixed": [], "bridge": []}, "seeds": [0, 1], "sets": ["world", "ood"], "rounds_per_run": 4,
            "eval_questions": 200, "curve": curve, "rounds": rounds}


def test_point_keeps_overall_and_per_type_figures():
    found = point("bridge", 0, 4, "world", _table("world", 60.0))
    assert found["em"] == 60.0 and found["recall_at_3"] == 90.0 and found["two_hop/em"] == 50.0


def test_markdown_reports_mean_and_std_over_seeds():
    text = results_markdown(_results())
    assert "| bridge | 4 | world | 73.5 ± 0.7 | 73.5 ± 0.7 | 90.0 ± 0.0 | 63.5 ± 0.7 | 80.0 ± 0.0 |" in text
    assert "| fixed | warm-up | ood | 50.5 ± 0.7 |" in text
    assert "| bridge | 0.600 | 0.900 | 0.50 |" in text
    assert "| bridge (4) | 73.5 (+3.0) | 63.5 (+3.0) | 73.5 (+3.0) | 63.5 (+3.0) |" in text, "Table 3: gain over fixed"
    assert "| fixed (4) | 70.5 | 60.5 |" in text
    assert "| oracle (warm-up policy, gold passages shown) | warm-up | world | 85.0 ± 0.0 |" in text


def test_results_are_written_as_json_markdown_and_curves_and_read_back(tmp_path):
    results = {**_results(), "paired": [], "final": [p for p in _results()["curve"] if p["round"] == 4]}
    written = write_results(tmp_path, results)
    assert [p.name for p in written] == ["results.json", "results.md", "curves.png"]
    assert json.loads(written[0].read_text()) == results
    assert written[1].read_text() == results_markdown(results) + "\n"
    assert written[2].stat().st_size > 10_000
    assert read_results(written[0])["final"][0]["em"] == results["final"][0]["em"]


def test_a_staged_preset_reports_its_own_last_round():
    results = _results()
    results["presets"]["rag_then_rl"] = {}
    results["curve"] += [point("rag_then_rl", s, r, name, _table(name, 60.0 + r)) for s in (0, 1)
                         for r in (0, 4, 12) for name in ("world", "ood")]
    results["rounds"] += [{"preset": "rag_then_rl", "seed": s, "round": r, "reward": 0.1 * r} for s in (0, 1)
                          for r in range(1, 13)]
    text = results_markdown(results)
    assert "| rag_then_rl | 12 | world | 72.0 ± 0.0 |" in text and "| fixed | 4 | world |" in text
    assert "| rag_then_rl | 0.100 | 1.200 |" in text, "a staged preset's curve: its stages' rounds end to end"


def _questions(ems: list[int], recalls: list[float]) -> dict:
    return {"uid": [f"q{i}" for i in range(len(ems))], "em": ems, "recall": recalls}


def test_paired_rows_difference_each_seed_and_all_seeds_from_the_same_questions():
    def tables(ems, recalls):
        return {"gap": {"questions": {"gap": _questions(ems, recalls)}}}

    last = {("fixed", 0): tables([0, 1, 0, 1], [0.5, 0.5, 0.0, 1.0]),
            ("bridge", 0): tables([1, 1, 0, 1], [1.0, 0.5, 0.5, 1.0]),
            ("fixed", 1): tables([0, 0, 0, 1], [0.5, 0.5, 0.5, 0.5]),
            ("bridge", 1): tables([0, 0, 1, 1], [0.5, 0.5, 0.5, 0.5])}
    rows = {row["seed"]: row for row in paired_rows(last, ["gap"])}
    assert set(rows) == {0, 1, "all"}
    assert rows[0]["diff_em"] == 25.0 and rows[0]["diff_recall_at_3"] == 25.0
    assert rows[1]["diff_recall_at_3"] == 0.0 and rows[1]["recall_ci_low"] == 0.0 == rows[1]["recall_ci_high"]
    assert rows["all"]["diff_em"] == 25.0 and rows["all"]["ci_low"] <= 25.0 <= rows["all"]["ci_high"]
    text = results_markdown({**_results(), "paired": list(rows.values())})
    assert "| bridge − fixed | gap | all | 4 | +25.0 [" in text

    last[("decoupled_rl", 0)] = tables([1, 0, 0, 1], [1.0, 0.5, 0.5, 1.0])
    pairs = {(row["preset"], row["baseline"], row["seed"]): row for row in paired_rows(last, ["gap"])}
    assert set(pairs) == {("bridge", "fixed", 0), ("bridge", "fixed", 1), ("bridge", "fixed", "all"),
                          ("decoupled_rl", "fixed", 0), ("bridge", "decoupled_rl", 0)}
    assert pairs["bridge", "decoupled_rl", 0]["diff_em"] == 25.0
    assert pairs["bridge", "decoupled_rl", 0]["diff_recall_at_3"] == 0.0

    assert rows["all"]["interval"] == QUESTION_LEVEL, "two seeds: over questions only, and marked so"
    assert "| bridge − fixed | gap | all | 4 | +25.0 [" in text and "| questions |" in text

    last[("fixed", 2)] = tables([0, 0, 0, 0], [0.5, 0.5, 0.5, 0.5])
    last[("bridge", 2)] = tables([1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5])
    three = {row["seed"]: row for row in paired_rows(last, ["gap"]) if row["preset"] == "bridge"
             and row["baseline"] == "fixed"}
    assert three["all"]["interval"] == TWO_LEVEL and three["all"]["diff_em"] == pytest.approx(50.0, abs=0.01)
    assert [three[s]["diff_em"] for s in (0, 1, 2)] == [25.0, 25.0, 100.0]
    assert all(three[s]["interval"] == QUESTION_LEVEL for s in (0, 1, 2))
    assert three["all"]["ci_high"] - three["all"]["ci_low"] > rows["all"]["ci_high"] - rows["all"]["ci_low"]
    kept = final_questions(last, ["gap"])
    assert {(q["preset"], q["seed"]) for q in kept} == set(last) and kept[0]["em"] == [0, 1, 0, 1]
    del last[("fixed", 2)], last[("bridge", 2)]

    last[("bridge", 1)]["gap"]["questions"]["gap"]["uid"] = ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="on gap: the two arms were evaluated on different questions"):
        paired_rows(last, ["gap"])


@pytest.mark.parametrize("per_seed", [False, True])
def test_the_report_says_where_the_runs_started(per_seed):
    text = results_markdown({**_results(), "warmup_per_seed": per_seed})
    assert ("from each seed's own warm-up" in text) == per_seed


def test_another_baseline_pairs_every_preset_against_it():
    """--baseline: variants of one schedule (e.g. a LoRA policy) against the default, on the dev split."""
    def tables(ems):
        return {"world": {"questions": {"world": _questions(ems, [1.0] * len(ems))}}}

    last = {("full", 0): tables([1, 0, 0, 1]), ("lora", 0): tables([1, 1, 0, 1]), ("lora_one_step", 0): tables([0] * 4)}
    pairs = {(row["preset"], row["baseline"]): row["diff_em"] for row in paired_rows(last, ["world"], "full")}
    assert pairs == {("lora", "full"): 25.0, ("lora_one_step", "full"): -50.0}
    results = _results()
    results["presets"] = {"bridge": [], "fixed": []}
    text = results_markdown({**results, "baseline": "bridge", "split": "dev"})
    assert "| fixed (4) | 70.5 (-3.0) |" in text and "(dev split)" in text
