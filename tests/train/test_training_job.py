"""The main job end to end on a local Ray instance: real actors, real DeepSpeed, real FAISS, real models.

One BRIDGE round runs with the packaged Gemma 3 270M and MiniLM; the resume test uses a tiny random
Gemma 3 (with the real tokenizer) so that six rounds fit in the suite's budget.
"""

from pathlib import Path

import pytest
import ray
from job_fixtures import job_config, tiny_policy_overrides

from bridge_ray.actors.coordinator import CoordinatorActor
from bridge_ray.cli import main
from bridge_ray.train.inputs import configured_world
from bridge_ray.train.phases import POLICY_UPDATE, RETRIEVER_UPDATE, ROLLOUT, check_bilevel_order, read_phases

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=800_000_000, log_to_driver=False)
    yield
    ray.shutdown()


def run_job(config, rounds: int | None = None, resume: bool = False) -> dict:
    coordinator = CoordinatorActor.remote(config, resume=resume)
    try:
        ray.get(coordinator.run.remote(rounds))
        return ray.get(coordinator.state.remote())
    finally:
        ray.get(coordinator.shutdown.remote())


@pytest.fixture(scope="module")
def bridge_round(local_ray, tmp_path_factory):
    config = job_config(tmp_path_factory.mktemp("bridge"), "run.rounds=1")
    coordinator = CoordinatorActor.remote(config)
    try:
        figures = ray.get(coordinator.run_round.remote())
        state = ray.get(coordinator.state.remote())
    finally:
        ray.get(coordinator.shutdown.remote())
    return config, figures, state


def test_one_bridge_round_retriever_before_policy(bridge_round):
    config, figures, state = bridge_round
    assert figures["retriever/turns"] > 0, "the few-shot prompt makes Gemma search"
    assert (state["round"], state["policy_version"], state["retriever_version"]) == (1, 1, 1)
    records = read_phases(Path(config.run.output_dir) / "phases.jsonl")
    check_bilevel_order(records)
    by_phase = {r.phase: r for r in records}
    assert by_phase[RETRIEVER_UPDATE].end <= by_phase[POLICY_UPDATE].start
    # samples were drawn with the current weights (synchronous mode), the policy update saw the new retriever
    assert by_phase[ROLLOUT].info["policy_versions"] == [0] and by_phase[ROLLOUT].info["retriever_versions"] == [0]
    assert by_phase[POLICY_UPDATE].retriever_version == 1
    assert 0.0 <= figures["reward"] <= 1.0 and figures["policy/action_tokens"] > 0


def test_checkpoint_loads_with_from_pretrained_and_peft(bridge_round):
    from peft import PeftModel
    from transformers import AutoModel, AutoModelForCausalLM

    from bridge_ray.retrieval.presets import resolve_model_path

    config, _, _ = bridge_round
    checkpoint = Path(config.run.output_dir) / "checkpoints" / "round-00000001"
    policy = AutoModelForCausalLM.from_pretrained(checkpoint / "policy")
    assert sum(p.numel() for p in policy.parameters()) > 100_000_000
    encoder = AutoModel.from_pretrained(resolve_model_path(config.retrieval.encoder.spec().model))
    adapted = PeftModel.from_pretrained(encoder, checkpoint / "retriever_adapter")
    lora_b = [p for n, p in adapted.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b), "the retriever update moved the adapter"


def test_eval_command_prints_the_table(bridge_round, capsys):
    config, _, _ = bridge_round
    test_split = configured_world(config) / "test.jsonl"
    out = Path(config.run.output_dir) / "eval.json"
    rc = main(["eval", "--checkpoint", str(Path(config.run.output_dir) / "checkpoints"),
               "--data", f"world={test_split}", "--max-questions", "2", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| world | 2 |" in printed and "M-Avg." in printed
    assert out.is_file()


def test_resume_reaches_the_state_of_an_uninterrupted_run(local_ray, tmp_path, tiny_policy):
    common = (*tiny_policy_overrides(tiny_policy), "run.rounds=3")
    straight = run_job(job_config(tmp_path / "straight", *common))
    interrupted = job_config(tmp_path / "resumed", *common)
    assert run_job(interrupted, rounds=2)["round"] == 2
    resumed = run_job(interrupted, resume=True)
    assert resumed == straight
    assert straight["round"] == 3 and straight["policy_version"] == 3
