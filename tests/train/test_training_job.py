"""The main job end to end on a local Ray instance: real actors, real DeepSpeed, real FAISS, MiniLM.

Two asynchronous BRIDGE rounds run with a LoRA on the protocol policy (``job_fixtures.save_protocol_policy``: a
tiny Gemma 3 that searches in every other trajectory), losing a shard holder on the way. Synchronous rounds (with
the tiny policy) and the other faults are in ``test_fault_tolerance.py``, resuming after a stopped driver in
``tests/cluster/test_submit_multinode.py``; the packaged Gemma 3 270M runs through the samplers in ``tests/agent``.
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import ray
from job_fixtures import job_config, kill_when_running, processes_titled, wait_until_running
from safetensors.torch import load_file

from bridge_ray.cli import main
from bridge_ray.coordinator.inputs import configured_world
from bridge_ray.coordinator.phases import POLICY_UPDATE, RETRIEVER_UPDATE, ROLLOUT, check_bilevel_order, read_phases
from bridge_ray.runtime.model_process import UNUSED_BY_ROLES
from bridge_ray.train.run import Run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bridge_rounds(local_ray, module_dir, protocol_policy):
    """Two asynchronous BRIDGE rounds (max_staleness 1); a shard holder is SIGKILLed during the first rollout.

    The policy is a LoRA (the samplers receive the adapter at each sync); the full fine-tune runs with the tiny
    policy in ``test_fault_tolerance.py``. One checkpoint, after the second round. That a checkpoint taken with a
    batch drawn ahead records the cursor from before it is checked in ``tests/coordinator/test_pipeline.py``.
    """
    config = job_config(module_dir, f"policy.model={protocol_policy}", "run.rounds=2", "rollout.max_staleness=1",
                        "checkpoint.every_rounds=2", "learner.lora.enabled=true",
                        "algorithm.grpo.rollouts_per_question=4")
    with Run(config) as run:  # as bench learn runs one: no train checks, the graph ends with the block
        run.connect()
        coordinator = run.start()  # the graph is up
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(coordinator.run_round)
            wait_until_running("Sampler.rollout")  # the first rollout is running ...
            killed = kill_when_running("ray::IndexShard", timeout_s=5)  # ... and loses a shard holder
            killed_at = time.time()
            figures = [first.result(), coordinator.run_round()]
        state = coordinator.state()
        shards = [p.pid for p in processes_titled("ray::IndexShard")]
        modules = {actor["name"]: loaded_modules(actor) for actor in ray.util.list_named_actors(all_namespaces=True)
                   if actor["name"].startswith(("sampler-", "policy-learner-", "retriever-learner-"))}
    assert run.coordinator is None
    yield config, figures, state, (killed, killed_at), shards, modules


def loaded_modules(named: dict[str, str]) -> set[str]:
    """The top-level packages a running named actor's process has imported."""
    actor = ray.get_actor(named["name"], namespace=named["namespace"])
    return ray.get(actor.__ray_call__.remote(lambda _: {name.split(".")[0] for name in sys.modules}), timeout=60)


def test_the_model_roles_load_nothing_transformers_would_import_for_no_use(bridge_rounds):
    """transformers imports scikit-learn and scipy wherever they are installed, for what no role runs: about 1.5
    CPU-seconds of each sampler's and learner's start (runtime/model_process.py)."""
    modules = bridge_rounds[-1]
    assert {name.split("-")[0] for name in modules} == {"sampler", "policy", "retriever"}
    for name, loaded in modules.items():
        assert "transformers" in loaded and not loaded & set(UNUSED_BY_ROLES), name


def test_the_graph_ends_with_the_run_block(bridge_rounds):
    for role in ("ray::Coordinator", "ray::Sampler", "ray::IndexShard", "ray::PolicyLearnerRank",
                 "ray::RetrieverLearner"):
        assert processes_titled(role) == [], f"{role} outlived the Run's block"


def test_async_bridge_rounds_keep_the_order_and_the_staleness_bound(bridge_rounds):
    config, figures, state, *_ = bridge_rounds
    assert figures[0]["retriever/turns"] > 0, "the protocol policy searches"
    assert (state["round"], state["policy_version"]) == (2, 2) and state["retriever_version"] >= 1
    records = read_phases(Path(config.run.output_dir) / "phases.jsonl")
    check_bilevel_order(records)
    phase = {(r.round, r.phase): r for r in records}
    for r in (0, 1):
        if (r, RETRIEVER_UPDATE) in phase:
            assert phase[r, RETRIEVER_UPDATE].end <= phase[r, POLICY_UPDATE].start
    # round 0 is drawn with the current weights; round 1's batch was generated while round 0's learners ran
    assert phase[0, ROLLOUT].info["policy_versions"] == [0] and phase[0, ROLLOUT].info["retriever_versions"] == [0]
    assert phase[1, ROLLOUT].info["sent"] < phase[0, POLICY_UPDATE].start
    assert phase[1, ROLLOUT].info["policy_versions"] == [0], "one version behind the learner (v1)"
    assert set(phase[1, ROLLOUT].info["retriever_versions"]) <= {0}
    assert [f["staleness/policy"] for f in figures] == [0, 1]
    assert all(f["staleness/retriever"] <= config.rollout.max_staleness for f in figures)
    assert phase[0, POLICY_UPDATE].retriever_version == 1, "the policy update saw the new retriever"
    # bounded: no batch drawn beyond the last round
    batch = config.rollout.questions_per_batch
    assert state["data_cursor"]["position"] == 2 * batch
    assert not (Path(config.run.output_dir) / "checkpoints" / "round-00000001").exists(), "checkpoint.every_rounds"
    for f in figures:
        assert 0.0 <= f["reward"] <= 1.0 and f["policy/action_tokens"] > 0
        assert f["throughput/tokens_per_s"] > 0 and f["time/round"] > 0


def test_a_shard_holder_killed_mid_rollout_restarts_and_no_trajectory_is_lost(bridge_rounds):
    config, _, _, (killed, killed_at), shards, _ = bridge_rounds
    assert len(shards) == config.retrieval.index.num_shards and killed not in shards, "Ray restarted the shard"
    records = read_phases(Path(config.run.output_dir) / "phases.jsonl")
    first = next(r for r in records if (r.round, r.phase) == (0, ROLLOUT))
    assert killed_at < first.end, "the shard holder died before the first rollout ended"
    for rollout in (r for r in records if r.phase == ROLLOUT):
        assert rollout.info["trajectories"] == rollout.info["questions"] * config.algorithm.grpo.rollouts_per_question


def test_checkpoint_loads_with_from_pretrained_and_peft(bridge_rounds, protocol_policy):
    from peft import PeftModel
    from transformers import AutoModel, AutoModelForCausalLM

    from bridge_ray.model_paths import resolve_model_path

    config, *_ = bridge_rounds
    checkpoint = Path(config.run.output_dir) / "checkpoints" / "round-00000002"
    policy = AutoModelForCausalLM.from_pretrained(checkpoint / "policy")
    base = load_file(protocol_policy / "model.safetensors")
    assert sum(p.numel() for p in policy.parameters()) == sum(t.numel() for t in base.values()), "merged, whole"
    encoder = AutoModel.from_pretrained(resolve_model_path(config.retrieval.encoder.spec().model))
    adapted = PeftModel.from_pretrained(encoder, checkpoint / "retriever_adapter")
    lora_b = [p for n, p in adapted.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b), "the retriever update moved the adapter"


def test_eval_command_prints_the_table(bridge_rounds, capsys):
    config, *_ = bridge_rounds
    test_split = configured_world(config) / "test.jsonl"
    out = Path(config.run.output_dir) / "eval.json"
    rc = main(["eval", "--checkpoint", str(Path(config.run.output_dir) / "checkpoints"),
               "--data", f"world={test_split}", "--max-questions", "2", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| world | 2 |" in printed and "M-Avg." in printed
    assert out.is_file()
