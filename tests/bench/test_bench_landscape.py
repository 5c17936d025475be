"""bench landscape at its smallest: the tiny Gemma, warmed up on a gold search so that it searches (``searching``
in conftest.py), a 3×3 grid; the final checkpoint is the tiny random policy with a query adapter whose B factors are
random (a real peft adapter, as a trained one); the JSON holds every grid, each centre is the objective at the
unperturbed checkpoint, and the PNG is written beside it.
"""

import json

import pytest
from job_fixtures import LOCAL_CPU, SMALL_JOB, job_config, write_checkpoint

from bridge_ray.checkpoint import RETRIEVER_ADAPTER_DIR
from bridge_ray.cli import main
from bridge_ray.probes.batch import RolloutBatch
from bridge_ray.probes.landscape import Objectives, load_encoder, load_policy

pytestmark = pytest.mark.slow  # a warm-up, rollouts and 2 × 18 forward passes of the tiny policy


def test_writes_every_grid_centred_on_the_unperturbed_objectives(searching, gemma_vocab_policy):
    tmp_path, overrides = searching
    config = job_config(tmp_path / "run", *overrides)
    final = write_checkpoint(tmp_path / "run" / "checkpoints", gemma_vocab_policy, config)
    out = tmp_path / "landscape.json"
    args = ["bench", "landscape", "--config", str(LOCAL_CPU), "--points", "3", "--span", "0.5", "--out", str(out),
            f"run.output_dir={tmp_path / 'run'}", *SMALL_JOB, *overrides]
    assert main(args) == 0
    figures = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert figures["axis"] == [-0.5, 0.0, 0.5] and figures["batch"]["retrieval_turns"] > 0
    assert figures["checkpoints"]["final"]["retriever_adapter"] == str(final / RETRIEVER_ADAPTER_DIR)

    # the centres, recomputed here on the same batch (same seed) at the unperturbed checkpoints
    batch = RolloutBatch(config, 1, figures["batch"]["policy"])
    objectives = Objectives(batch, load_policy(batch.policy))
    states = (("initial", batch.policy, None), ("final", final / "policy", final / RETRIEVER_ADAPTER_DIR))
    for label, policy, adapter in states:
        grids = figures["checkpoints"][label]
        assert set(grids) >= {"rag_joint", "rl_joint", "rl_theta"}
        for name in ("rag_joint", "rl_joint", "rl_theta"):
            values = grids[name]["values"]
            assert len(values) == 3 and all(len(row) == 3 for row in values)
            assert grids[name]["centre"] == values[1][1]
        model, encoder = load_policy(str(policy)), load_encoder(config, adapter)
        log_rho = batch.log_rho(encoder)
        assert grids["rag_joint"]["centre"] == pytest.approx(objectives.rag(log_rho, objectives.answer_logp(model)),
                                                             rel=1e-5)
        rl = objectives.policy_loss(model) + objectives.retrieval_loss(log_rho)
        assert grids["rl_joint"]["centre"] == pytest.approx(rl, rel=1e-5, abs=1e-7)
        assert grids["rl_theta"]["centre"] == pytest.approx(rl, rel=1e-5, abs=1e-7)
        # away from the centre the objectives move: the directions are not zero
        assert len({round(v, 6) for row in grids["rag_joint"]["values"] for v in row}) > 1


def test_a_batch_whose_rewards_all_agree_is_refused(searching, gemma_vocab_policy, capsys):
    """One rollout per question: every group's rewards agree, the RL loss is 0 everywhere, nothing to draw."""
    tmp_path, overrides = searching
    write_checkpoint(tmp_path / "agree" / "checkpoints", gemma_vocab_policy, job_config(tmp_path / "agree", *overrides))
    args = ["bench", "landscape", "--config", str(LOCAL_CPU), "--points", "3", "--out", str(tmp_path / "agree.json"),
            f"run.output_dir={tmp_path / 'agree'}", *SMALL_JOB, *overrides, "algorithm.grpo.rollouts_per_question=1"]
    assert main(args) == 2
    assert "every group's rewards agree" in capsys.readouterr().err
    assert not (tmp_path / "agree.json").exists()
