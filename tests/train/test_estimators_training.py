"""``algorithm.estimator: drop | two_state`` train for real: one round of each through the actor graph (samplers,
shard holders, the retriever learner, the DeepSpeed policy learner) from the same seed. That Drop adds
``γ∇θ L_RAG`` to BRIDGE's gradient is checked on the learner's ranks (tests/policy_learner/test_rag_terms_ranks.py);
BRIDGE's own rounds run in test_training_job.py. The
two-state round runs with ``two_state.candidates: own``, the longer path (η* retrieves its own top k, the samplers
score them); ``logged`` differs from it only in skipping that step (tests/coordinator/test_coordinator_unit.py).

The policy is the protocol bigram machine of ``job_fixtures.save_protocol_policy``: a round has searches and
mixed rewards (every golden answer is "blue"), which a random tiny model never produces. Everything else is the
real job.
"""

import json
from pathlib import Path

import pytest
import torch
from job_fixtures import job_config
from safetensors.torch import load_file

from bridge_ray.checkpoint import (
    LOWER_RETRIEVER_ADAPTER_DIR,
    LOWER_RETRIEVER_OPTIMIZER_FILE,
    POLICY_DIR,
    RETRIEVER_ADAPTER_DIR,
)
from bridge_ray.coordinator.handle import start_coordinator
from bridge_ray.coordinator.inputs import index_dir
from bridge_ray.coordinator.phases import (
    LOWER_RETRIEVER_UPDATE,
    POLICY_UPDATE,
    RETRIEVER_UPDATE,
    check_bilevel_order,
    read_phases,
)
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retriever_learner.two_state import LowerLevelState

pytestmark = pytest.mark.slow
ESTIMATORS = ("drop", "two_state")


@pytest.fixture(scope="module")
def runs(local_ray, module_dir, protocol_policy):
    """One round of each estimator from the same seed and data: (config, figures, run folder) by estimator."""
    policy = protocol_policy
    questions = module_dir / "questions.jsonl"
    questions.write_text("".join(
        json.dumps({"id": f"q{i}", "question": f"What colour is the banner of {town}?", "golden_answers": ["blue"]})
        + "\n" for i, town in enumerate(["Varnholt", "Ostrava", "Couxholm", "Shiastford"])
    ))
    out = {}
    for estimator in ESTIMATORS:
        config = job_config(
            module_dir / estimator, f"policy.model={policy}", "algorithm.grpo.kl_coef=0.0", f"data.train=[{questions}]",
            f"algorithm.estimator={estimator}", "algorithm.grpo.rollouts_per_question=4", "run.rounds=1",
            "algorithm.retriever.lr=1e-2", "telemetry.wandb_mode=disabled", "algorithm.two_state.candidates=own",
        )
        coordinator = start_coordinator(config)
        try:
            figures = coordinator.run_round()
        finally:
            coordinator.shutdown()
        out[estimator] = config, figures, Path(config.run.output_dir)
    return out


def _checkpoint(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def _policy(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(_checkpoint(run) / POLICY_DIR / "model.safetensors"))


def _differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and any(not torch.equal(a[k], b[k]) for k in a)


def test_the_estimators_see_the_same_round_and_change_the_policy_update(runs):
    figures = {e: runs[e][1] for e in ESTIMATORS}
    assert figures["drop"]["retriever/turns"] > 0, "the bigram policy searches"
    assert 0 < figures["drop"]["reward"] < 1, "mixed rewards: the RL gradient is not zero"
    # the same rollouts and retriever update: only the policy's gradient differs
    for key in ("reward", "retriever/turns", "retriever/loss", "retriever/step_kl"):
        assert figures["two_state"][key] == figures["drop"][key], key
    assert figures["drop"]["retriever/step_kl"] > 0, "the round's step moved the ranking of its candidates"
    assert figures["drop"]["policy/rag_nll"] > 0 and "policy/rag_nll_lower" not in figures["drop"]
    assert figures["two_state"]["policy/rag_nll"] == pytest.approx(figures["drop"]["policy/rag_nll"], rel=1e-4)
    assert figures["two_state"]["policy/rag_nll_lower"] > 0
    policies = {e: _policy(runs[e][2]) for e in ESTIMATORS}
    assert _differ(policies["drop"], policies["two_state"]), "two-state subtracts γ∇θ L_RAG(θ, η*)"


def test_phases_record_the_estimator_and_the_lower_retriever_update(runs):
    for estimator in ESTIMATORS:
        records = read_phases(runs[estimator][2] / "phases.jsonl")
        check_bilevel_order(records)
        phase = {r.phase: r for r in records}
        assert phase[POLICY_UPDATE].info["estimator"] == estimator
        assert (LOWER_RETRIEVER_UPDATE in phase) == (estimator == "two_state")
    phase = {r.phase: r for r in read_phases(runs["two_state"][2] / "phases.jsonl")}
    lower = phase[LOWER_RETRIEVER_UPDATE]
    assert phase[RETRIEVER_UPDATE].end <= lower.start and lower.end <= phase[POLICY_UPDATE].start
    # candidates own: the samplers scored η*'s own top k of every logged turn, inside η*'s phase
    assert lower.info["own_scored"] == phase[RETRIEVER_UPDATE].info["turns"] > 0
    assert runs["two_state"][1]["lower_retriever/own_scored"] == lower.info["own_scored"]


def test_eta_star_trains_on_its_own_and_its_checkpoint_round_trips(runs):
    config, figures, run = runs["two_state"]
    checkpoint = _checkpoint(run)
    assert figures["lower_retriever/retriever_version"] == 1.0
    lower = load_file(str(checkpoint / LOWER_RETRIEVER_ADAPTER_DIR / "adapter_model.safetensors"))
    penalized = load_file(str(checkpoint / RETRIEVER_ADAPTER_DIR / "adapter_model.safetensors"))
    lora_b = [k for k in lower if "lora_B" in k]
    assert lora_b and any(lower[k].abs().sum() > 0 for k in lora_b), "η* moved from η_0 (LoRA B starts at 0)"
    assert _differ(lower, penalized), "η* is not η_γ"
    assert not (_checkpoint(runs["drop"][2]) / LOWER_RETRIEVER_ADAPTER_DIR).exists()
    # a resumed two-state run starts η* from the checkpoint: its adapter and its optimizer state
    shards = ShardSet.local(index_dir(config), config.retrieval.encoder.spec())
    restored = LowerLevelState(config.retrieval, config.algorithm.retriever, shards, "cpu", checkpoint)
    state = restored.updater.encoder.adapter_state_dict()
    assert set(state) == set(lower) and all(torch.equal(state[k], lower[k]) for k in lower)
    saved_optimizer = torch.load(checkpoint / LOWER_RETRIEVER_OPTIMIZER_FILE, weights_only=True)
    assert restored.updater.optimizer.state_dict()["state"].keys() == saved_optimizer["state"].keys() != set()
