"""The policy learner for real: Ray actors, DeepSpeed ZeRO-2/3 on CPU with gloo, 1 and 2 ranks."""

import json
import os
import shutil
from pathlib import Path

import pytest
import ray
import torch
from learner_fixtures import make_policy_batch, tiny_gemma3
from transformers import AutoModelForCausalLM, AutoTokenizer

from bridge_ray.checkpoint import (
    POLICY_ADAPTER_DIR,
    POLICY_DIR,
    POLICY_STATE_DIR,
    POLICY_STATE_TAG,
    CheckpointManager,
    Manifest,
    load_manifest,
)
from bridge_ray.config import load_config
from bridge_ray.coordinator.graph import start_policy_learner
from bridge_ray.engines.precision import cpu_has_bf16
from bridge_ray.model_paths import MINILM, resolve_model_path
from bridge_ray.policy_learner.learner import forward_record
from bridge_ray.policy_learner.lr_schedule import lr_multiplier
from bridge_ray.policy_learner.objective import (
    action_weights,
    policy_objective,
    sequence_log_probs,
    with_learner_old_logp,
)
from bridge_ray.runtime.placement import PlacementError

pytestmark = pytest.mark.slow

TOKENIZER_DIR = Path(resolve_model_path(MINILM))


def learner_config(*overrides):
    return load_config(
        None,
        [
            "roles.policy_learner.cpus=0.5",
            "roles.policy_learner.gpus=0",
            "learner.dtype=float32",  # compared with fp32 single-process updates
            "learner.micro_batch_size=1",
            "rollout.questions_per_batch=3",
            "optim.mini_batch_size=3",
            "optim.lr=0.001",
            "run.rounds=4",
            *overrides,
        ],
    )


def odd_batch():
    """5 trajectories of 3 questions (one group short): 2 ranks then need a zero-weight filler row."""
    batch = make_policy_batch(tiny_gemma3(), questions=3, rollouts=2)
    return batch.select(torch.arange(5))


def reference_run(model_dir, batch, config, steps):
    """The same updates in one process, one forward over the whole mini-batch, plain torch AdamW.

    Each step is a round of its own, so π_old (and the TIS weights) come from the weights before it.
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay)
    grpo, weighted = config.algorithm.grpo, batch.with_token_weights(config.algorithm.grpo.loss_agg)
    history = []
    for step in range(steps):
        lr = config.optim.lr * lr_multiplier(
            step, warmup=config.optim.warmup_steps, total=4, schedule="constant", min_ratio=0.0
        )
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        logp, entropy = sequence_log_probs(model, weighted, with_entropy=True)
        with torch.no_grad():
            ref_logp = sequence_log_probs(reference, weighted)[0]
        ready, gap = with_learner_old_logp(weighted, logp.detach(), grpo)
        loss, _ = policy_objective(logp, ready, grpo, ref_logp, entropy)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
        optimizer.step()
        history.append({"loss": float(loss.detach()), "grad_norm": float(norm), "lr": lr, "old_logp_gap": float(gap)})
    return history, dict(model.named_parameters())


@pytest.fixture(scope="class", params=[2, 3], ids=["zero2", "zero3-gradient-checkpointing"])
def two_rank_group(request, local_ray, tiny_model_dir):
    config = learner_config(
        "roles.policy_learner.count=2",
        f"learner.zero_stage={request.param}",
        f"learner.gradient_checkpointing={str(request.param == 3).lower()}",
        "algorithm.grpo.kl_coef=0.1",
        "algorithm.grpo.entropy_coef=0.01",
        "optim.warmup_steps=2",
        "optim.grad_clip=0.5",
        "algorithm.grpo.tis_cap=1.05",  # the batch's sampler log-probs are the model's + 0.1 N(0, 1): some capped
    )
    group = start_policy_learner(config, tiny_model_dir, tokenizer_path=TOKENIZER_DIR).ready()
    yield config, group
    group.shutdown()


class TestTwoRanks:
    """Fixtures are class-scoped so that each group frees its share of the 2 cores when its class ends."""

    def test_two_ranks_with_micro_batches_match_one_process_on_the_whole_batch(self, two_rank_group, tiny_model_dir):
        """Global normalisation through DeepSpeed: loss, grad norm (pre-clip), lr and updated weights all match.

        π_old is each round's own (only) step's training forward, so the first ratio is 1 although the
        sampler's log-probs are off, the TIS weights of that mismatch reach the loss, and no separate π_old
        pass runs."""
        config, group = two_rank_group
        batch = odd_batch()
        expected, expected_weights = reference_run(tiny_model_dir, batch, config, steps=2)
        got = [group.train(batch) for _ in range(2)]
        for want, metrics in zip(expected, got, strict=True):
            assert metrics["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)
            assert metrics["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
            assert metrics["lr"] == pytest.approx(want["lr"])
            assert metrics["old_logp_gap"] == pytest.approx(want["old_logp_gap"], rel=1e-5)
            assert metrics["clipfrac"] == 0 and abs(metrics["ratio_mean"] - 1) < 1e-5
        assert got[0]["grad_norm"] > config.optim.grad_clip, "clipping was exercised"
        assert got[1]["kl"] > 0 and got[1]["entropy"] > 0, "the KL and entropy terms were exercised"
        assert [m["policy_version"] for m in got] == [1.0, 2.0] and got[0]["optimizer_steps"] == 1.0
        # 5 rows over 2 ranks, one row per micro-batch: 3 micro-batches a rank, one of them a filler row
        assert all(forward_record(m)["forwards"] == {"old_logp": 0, "train": 6, "reference": 6} for m in got)
        weights = ray.get(group.weights_for_sync())
        assert weights.version == 2 and weights.adapter_config is None
        assert set(weights.tensors) == set(expected_weights)
        for name, value in weights.tensors.items():
            assert torch.allclose(value, expected_weights[name].detach(), atol=2e-5), name

    def test_saved_policy_loads_with_from_pretrained(self, two_rank_group, tmp_path):
        _, group = two_rank_group
        weights = ray.get(group.weights_for_sync()).tensors
        group.save(tmp_path)
        policy = tmp_path / POLICY_DIR
        assert (policy / "model.safetensors").is_file() and not list(policy.glob("*.bin"))
        loaded = dict(AutoModelForCausalLM.from_pretrained(policy).named_parameters())
        assert all(torch.equal(loaded[name], value) for name, value in weights.items())
        assert AutoTokenizer.from_pretrained(policy)("who founded Veltria?")["input_ids"]
        assert (tmp_path / POLICY_STATE_DIR / POLICY_STATE_TAG).is_dir()


def test_the_first_steps_pi_old_comes_from_its_training_forward_and_the_update_is_unchanged(
    local_ray, tiny_model_dir
):
    """Two mini-batches a round: the π_old pass runs over the second only, and with ``learner.reuse_old_logp``
    off over both, as it used to; both updates are the same (loss, grad norm, old_logp_gap, weights)."""
    batch = make_policy_batch(tiny_gemma3(), questions=4, rollouts=2)
    results = {}
    for reuse in (True, False):
        config = learner_config(
            "rollout.questions_per_batch=4", "optim.mini_batch_size=2", "learner.micro_batch_size=2",
            "algorithm.grpo.kl_coef=0.1", "algorithm.grpo.tis_cap=1.05", f"learner.reuse_old_logp={str(reuse).lower()}",
        )
        group = start_policy_learner(config, tiny_model_dir).ready()
        try:
            results[reuse] = group.train(batch), ray.get(group.weights_for_sync()).tensors
        finally:
            group.shutdown()
    (reused, weights), (separate, separate_weights) = results[True], results[False]
    assert reused["optimizer_steps"] == 2.0
    assert forward_record(reused)["forwards"] == {"old_logp": 2, "train": 4, "reference": 4}
    assert forward_record(separate)["forwards"] == {"old_logp": 4, "train": 4, "reference": 4}
    assert separate["old_logp_tokens"] == separate["train_tokens"] > reused["old_logp_tokens"] > 0
    for key in ("loss", "grad_norm", "old_logp_gap", "ratio_mean"):
        assert reused[key] == pytest.approx(separate[key], rel=1e-5, abs=1e-7), key
    for name, value in weights.items():
        assert torch.allclose(value, separate_weights[name], atol=1e-6), name


def test_lora_policy_on_zero3_trains_syncs_and_resumes_only_the_adapter(local_ray, tiny_model_dir, tmp_path):
    from peft import PeftModel

    config = learner_config(
        "learner.zero_stage=3", "learner.lora.enabled=true", "learner.lora.rank=4", "algorithm.grpo.kl_coef=0.1"
    )
    batch = make_policy_batch(tiny_gemma3(), questions=3, rollouts=2)
    group = start_policy_learner(config, tiny_model_dir).ready()
    try:
        rounds = [group.train(batch) for _ in range(3)]
        weights = ray.get(group.weights_for_sync())
        group.save(tmp_path)
        continued = group.train(batch)
    finally:
        group.shutdown()
    resumed_group = start_policy_learner(config, tiny_model_dir).ready()  # the saved state holds only the adapter
    try:
        resumed_group.load(tmp_path)
        restored = ray.get(resumed_group.weights_for_sync())
        resumed = resumed_group.train(batch)
    finally:
        resumed_group.shutdown()
    assert restored.version == 3 and all(torch.equal(restored.tensors[k], v) for k, v in weights.tensors.items())
    [states] = (tmp_path / POLICY_STATE_DIR / POLICY_STATE_TAG).glob("*model_states.pt")
    saved_module = torch.load(states, map_location="cpu", weights_only=False)["module"]
    assert saved_module and all("lora_" in name for name in saved_module), "no frozen weight, not the tied LM head"
    assert resumed["loss"] == pytest.approx(continued["loss"], rel=1e-6)
    # π_old is recomputed with the adapter on: the adapter moves every round, yet every first ratio is 1
    assert all(m["clipfrac"] == 0 and abs(m["ratio_mean"] - 1) < 1e-5 for m in [*rounds, continued])
    assert weights.adapter_config["r"] == 4 and weights.tensors
    assert json.loads(json.dumps(weights.adapter_config)) == weights.adapter_config, "the samplers write it as JSON"
    assert all("lora_A" in name or "lora_B" in name for name in weights.tensors)
    assert any(t.abs().sum() > 0 for name, t in weights.tensors.items() if "lora_B" in name)

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / POLICY_DIR).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with_adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / POLICY_ADAPTER_DIR
    ).eval()
    with torch.no_grad():
        logp_merged = sequence_log_probs(merged, batch)[0]
        logp_adapter = sequence_log_probs(with_adapter, batch)[0]
        logp_base = sequence_log_probs(base, batch)[0]
    assert torch.allclose(logp_merged, logp_adapter, atol=1e-5), "merged export == base + adapter"
    assert not torch.allclose(logp_merged, logp_base, atol=1e-4), "the adapter changed the policy"
    token_weights = action_weights(batch.with_token_weights(config.algorithm.grpo.loss_agg), torch.float32)
    gain = (batch.advantages[:, None] * token_weights * (logp_merged - logp_base)).sum()
    assert gain > 0, "the updates raised the log-probs of tokens with positive advantage, lowered the others"


class _Exploit:
    """A pickle that runs code when loaded with plain torch.load."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_resume_continues_exactly_and_an_interrupted_save_keeps_the_previous(local_ray, tiny_model_dir, tmp_path):
    # bf16 where the CPU computes it (config refuses emulated bf16): resuming must restore DeepSpeed's fp32 master
    # weights, not just the bf16 module weights. Sampler log-probs in the ratio: the same batch's loss then falls
    # from round to round
    dtype = "bf16" if cpu_has_bf16() else "fp32"
    config = learner_config(
        "learner.zero_stage=2", f"learner.dtype={dtype}", "algorithm.grpo.kl_coef=0", "algorithm.grpo.old_logp=sampler"
    )
    batch = make_policy_batch(tiny_gemma3(), questions=3, rollouts=2)
    manager = CheckpointManager(tmp_path / "ckpt", keep=2)

    first = start_policy_learner(config, tiny_model_dir).ready()
    try:
        assert ray.get(first.ranks[0].__ray_call__.remote(lambda rank: rank.reference)) is None, "kl_coef 0: no ref"
        losses = [first.train(batch)["loss"] for _ in range(2)]
        assert losses[1] < losses[0]
        saved = ray.get(first.weights_for_sync()).tensors
        manifest = Manifest(round=2, policy_version=first.version, retriever_version=0, data_cursor={"next": 6})
        good = manager.save(manifest, first.save, config)

        def crash_midway(directory):
            first.save(directory)
            raise RuntimeError("preempted while writing")

        with pytest.raises(RuntimeError, match="preempted"):
            manager.save(Manifest(round=3, policy_version=3, retriever_version=0), crash_midway, config)
        continued = first.train(batch)
        continued_weights = ray.get(first.weights_for_sync()).tensors
    finally:
        first.shutdown()

    latest = manager.latest()
    assert latest == good and load_manifest(latest).policy_version == 2
    loaded = dict(AutoModelForCausalLM.from_pretrained(latest / POLICY_DIR).named_parameters())
    assert all(torch.equal(loaded[name], value) for name, value in saved.items())

    tampered = tmp_path / "tampered"
    shutil.copytree(latest, tampered)
    marker = tmp_path / "exploit-ran"
    states = tampered / POLICY_STATE_DIR / POLICY_STATE_TAG / "mp_rank_00_model_states.pt"
    torch.save({"module": _Exploit(str(marker))}, states)

    second = start_policy_learner(config, tiny_model_dir).ready()
    try:
        with pytest.raises(ValueError, match="refusing to load DeepSpeed state"):
            second.load(tampered)
        assert not marker.exists()
        second.load(latest)
        assert second.version == 2
        resumed = second.train(batch)
        resumed_weights = ray.get(second.weights_for_sync()).tensors
    finally:
        second.shutdown()
    for key in ("loss", "grad_norm", "lr", "policy_version"):
        assert resumed[key] == pytest.approx(continued[key], rel=1e-6), key
    assert all(torch.equal(resumed_weights[name], value) for name, value in continued_weights.items())


def test_learner_group_fails_fast_when_asking_for_gpus_on_a_cpu_cluster(local_ray, tiny_model_dir):
    config = load_config(
        None, ["roles.policy_learner.count=2", "roles.policy_learner.gpus=1", "roles.policy_learner.cpus=0.5"]
    )
    with pytest.raises(PlacementError, match=r"role 'policy_learner'.*missing GPU 2"):
        start_policy_learner(config, tiny_model_dir)


def test_ranks_that_do_not_set_up_within_the_startup_timeout_are_an_error_naming_the_key(local_ray, tiny_model_dir):
    config = learner_config("roles.policy_learner.startup_timeout_s=0.01")
    started = []
    # The limit bounds the placement group first, then the ranks' setup: either may be the one to miss it.
    with pytest.raises(PlacementError,
                       match=r"role 'policy_learner'.*within roles.policy_learner.startup_timeout_s=0.01s"):
        started.append(start_policy_learner(config, tiny_model_dir))  # sends the setup without waiting for it
        started[0].ready()
    assert not any(group.ranks.handles for group in started), "the ranks were ended"
