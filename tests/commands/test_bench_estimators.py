"""``bench estimators`` on real rollouts of the packaged Gemma 3 270M: the three θ-gradients and their agreement."""

import json

import pytest
from job_fixtures import LOCAL_CPU, SMALL_JOB

from bridge_ray.cli import main

pytestmark = pytest.mark.slow


def test_bench_estimators_writes_the_agreement_of_bridge_and_drop_with_two_state(tmp_path, capsys):
    out = tmp_path / "estimators.json"
    rc = main(["bench", "estimators", "--config", str(LOCAL_CPU), "--questions", "2", "--gammas", "0.5",
               "--retriever-steps", "2", "--out", str(out), *SMALL_JOB, "algorithm.retriever.lr=1e-2"])
    assert rc == 0
    figures = json.loads(out.read_text())
    assert figures["retrieval_turns"] > 0, "the few-shot prompt makes Gemma search"
    (row,) = figures["rows"]
    assert row["gamma"] == 0.5 and row["eta_gap"] > 0, "eta_gamma and eta* are different retriever states"
    for name in ("bridge", "drop"):
        assert -1.0 <= row[f"{name}_cosine"] <= 1.0 and row[f"{name}_relative_error"] >= 0.0
    # Drop − two-state = γ ∇L_RAG(θ, η*), BRIDGE − two-state = −γ (∇L_RAG(θ, η_γ) − ∇L_RAG(θ, η*)): they differ
    assert row["bridge_relative_error"] != row["drop_relative_error"]
    assert out.with_suffix(".png").stat().st_size > 0
    assert "BRIDGE cos" in capsys.readouterr().out
