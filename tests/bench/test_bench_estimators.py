"""bench estimators at its smallest: the tiny Gemma warmed up to search (``searching`` in conftest.py), two γ, one
retriever step per state, two batches of one question each. The batches ask the fixture's question under two uids
(the warm-up's demonstration is that question, so the tiny policy searches in both) and sample with two seeds.
"""

import json
import statistics

import pytest
from job_fixtures import LOCAL_CPU, SMALL_JOB

from bridge_ray.cli import main


@pytest.mark.slow  # a warm-up, rollouts and the θ-gradients of the tiny policy for two batches
def test_estimators_per_batch_rows_and_their_means_over_batches(searching, capsys):
    root, overrides = searching
    question = json.loads((root / "train.jsonl").read_text())
    train = root / "train-twice.jsonl"
    train.write_text(json.dumps(question) + "\n" + json.dumps({**question, "id": question["id"] + "-again"}) + "\n")
    out = root / "estimators.json"
    def bench(batches: int, gammas: str = "0.5,2") -> int:
        return main(["bench", "estimators", "--config", str(LOCAL_CPU), "--gammas", gammas, "--questions", "1",
                     "--batches", str(batches), "--retriever-steps", "1", "--out", str(out),
                     f"run.output_dir={root / 'estimators-run'}", *SMALL_JOB, *overrides, f"data.train=[\"{train}\"]"])

    assert bench(1) == 0  # a run stopped after one batch ...
    first_rows = json.loads(out.read_text())["rows"]
    assert bench(2) == 0  # ... is continued, not started over
    assert "continuing" in capsys.readouterr().out
    figures = json.loads(out.read_text())
    assert figures["rows"][:len(first_rows)] == first_rows
    assert bench(2, "0.5") == 2  # other settings are refused, naming them, and the figures stay
    assert "gammas [0.5, 2.0] here, [0.5] asked" in capsys.readouterr().err
    assert json.loads(out.read_text()) == figures
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert figures["skipped"] == []
    first, second = figures["batches"]
    assert (first["first_question"], second["first_question"]) == (0, 1)
    assert first["seed"] != second["seed"] and first["question_uids"] != second["question_uids"]
    assert all(b["retrieval_turns"] > 0 and b["rl_gradient_norm"] >= 0 for b in figures["batches"])
    for gamma, summary in zip((0.5, 2.0), figures["summary"], strict=True):
        rows = [r for r in figures["rows"] if r["gamma"] == gamma]
        assert sorted(r["batch"] for r in rows) == [0, 1]
        assert summary["gamma"] == gamma and summary["batches"] == 2
        for row in rows:
            assert row["two_state_norm"] > 0
            for name in ("bridge", "drop"):
                assert -1 <= row[f"{name}_cosine"] <= 1 and row[f"{name}_relative_error"] >= 0
            # Drop − two-state = γ∇θ L_RAG(θ, η*), BRIDGE − two-state = γ∇θ[L_RAG(θ, η*) − L_RAG(θ, η_γ)]: they differ
            assert row["drop_relative_error"] != row["bridge_relative_error"]
        for key in ("bridge_cosine", "bridge_relative_error", "drop_cosine", "drop_relative_error"):
            figure = summary[key]
            assert figure["mean"] == pytest.approx(statistics.mean(r[key] for r in rows))
            assert figure["ci_low"] <= figure["mean"] <= figure["ci_high"]


def test_more_batches_than_the_train_split_holds_are_refused(searching, capsys):
    root, overrides = searching
    args = ["bench", "estimators", "--config", str(LOCAL_CPU), "--questions", "1", "--batches", "2",
            "--first-question", "1", "--out", str(root / "refused.json"), f"run.output_dir={root / 'refused-run'}",
            *SMALL_JOB, *overrides]
    assert main(args) == 2
    assert "needs 3 train questions; the train split has 1" in capsys.readouterr().err
    assert not (root / "refused.json").exists()


@pytest.mark.slow  # a warm-up and rollouts of the tiny policy
def test_a_batch_whose_rewards_all_agree_is_skipped_and_recorded(searching, capsys):
    """One rollout per question: every group's rewards agree, so the RL gradient is 0 and BRIDGE's estimate with
    it; the batch is skipped, and with no other question left the command says so."""
    root, overrides = searching
    out = root / "agree.json"
    args = ["bench", "estimators", "--config", str(LOCAL_CPU), "--questions", "1", "--out", str(out),
            f"run.output_dir={root / 'agree-run'}", *SMALL_JOB, *overrides, "algorithm.grpo.rollouts_per_question=1"]
    assert main(args) == 2
    assert "ran out after 0 of --batches 1 measured batches and 1 skipped" in capsys.readouterr().err
    figures = json.loads(out.read_text())
    assert figures["batches"] == [] and figures["rows"] == []
    [skipped] = figures["skipped"]
    assert skipped["batch"] == 0 and "rewards agree" in skipped["reason"]
