"""The compute precision rule (``learner.dtype``, ``policy.dtype``) and the HF engine under CPU bf16 autocast."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bridge_ray.config import load_config
from bridge_ray.engines.base import PrefixGroup, SamplingSpec
from bridge_ray.engines.factory import build_hf_engine
from bridge_ray.engines.hf import HFEngine
from bridge_ray.engines.models import load_causal_lm, load_tokenizer
from bridge_ray.engines.precision import (
    BF16,
    BF16_AUTOCAST,
    FP32,
    autocast_weight,
    cpu_has_bf16,
    has_bf16_flags,
    resolve_precision,
    vllm_dtype,
)

# |log p(bf16 autocast) − log p(fp32)| per scored token on the tiny random Gemma 3 (its bf16 rounding gives ~0.005).
LOGP_TOLERANCE = 0.02


def test_cpu_flags_name_the_bf16_instruction_sets():
    line = "flags\t\t: fpu sse2 avx2 avx512f {}\n"
    assert has_bf16_flags("processor\t: 0\n" + line.format("avx512_bf16"))
    assert has_bf16_flags(line.format("amx_tile amx_bf16"))
    assert not has_bf16_flags(line.format("avx512_vnni"))
    assert not has_bf16_flags("model name\t: CPU with avx512_bf16 in its name\n" + line.format(""))


@pytest.mark.parametrize(
    ("value", "device", "cpu_bf16", "expected"),
    [
        ("auto", "cuda", False, BF16),
        ("auto", "cpu", True, BF16_AUTOCAST),
        ("auto", "cpu", False, FP32),
        ("fp32", "cpu", True, FP32),
        ("float32", "cuda", False, FP32),
        ("bf16", "cpu", True, BF16),
        ("bf16-autocast", "cpu", True, BF16_AUTOCAST),
        ("bfloat16", "cuda", False, BF16),
    ],
)
def test_the_config_value_decides_the_precision(value, device, cpu_bf16, expected):
    assert resolve_precision(value, "learner.dtype", device, cpu_bf16=cpu_bf16) == expected


@pytest.mark.parametrize("value", ["bf16", "bf16-autocast", "bfloat16"])
def test_bf16_on_a_cpu_without_bf16_instructions_is_an_error_naming_the_key(value):
    with pytest.raises(ValueError, match=rf"policy\.dtype={value}: this CPU has no bf16 instructions"):
        resolve_precision(value, "policy.dtype", "cpu", cpu_bf16=False)


def test_names_and_fp32_master_weights():
    assert [p.name for p in (FP32, BF16, BF16_AUTOCAST)] == ["fp32", "bf16", "bf16-autocast"]
    assert BF16.with_fp32_weights() == BF16_AUTOCAST and FP32.with_fp32_weights() == FP32
    linear = torch.nn.Linear(4, 4)
    with BF16_AUTOCAST.context("cpu"):
        assert linear(torch.ones(1, 4)).dtype == torch.bfloat16
    with FP32.context("cpu"):
        assert linear(torch.ones(1, 4)).dtype == torch.float32


def test_a_frozen_weight_is_cast_once_bitwise_as_autocast_casts_it_and_again_once_changed():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=False).requires_grad_(False)
    hidden = torch.randn(3, 16, requires_grad=True)
    with BF16_AUTOCAST.context("cpu"):
        expected = head(hidden)
        cast = autocast_weight(head.weight, "cpu")
        got = torch.nn.functional.linear(hidden.to(cast.dtype), cast)
        assert autocast_weight(head.weight, "cpu") is cast, "cast once, not at every forward"
    assert torch.equal(got, expected)
    (grad,) = torch.autograd.grad(expected.float().sum(), hidden)
    assert torch.equal(torch.autograd.grad(got.float().sum(), hidden)[0], grad), "the input's gradient too"
    with torch.no_grad():
        head.weight.mul_(2)  # a weight sync writes in place
    with BF16_AUTOCAST.context("cpu"):
        assert torch.equal(autocast_weight(head.weight, "cpu"), (head.weight * 1).to(torch.bfloat16))
    trained = torch.nn.Parameter(torch.ones(2, 2))
    with BF16_AUTOCAST.context("cpu"):
        assert autocast_weight(trained, "cpu") is trained, "autocast caches a trained weight's cast itself"
    assert autocast_weight(head.weight, "cpu") is head.weight, "no autocast: the weight as it is"
    partition = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    partition.ds_id = 7  # DeepSpeed ZeRO-3 marks its partitioned parameters so; outside a forward they are empty
    with BF16_AUTOCAST.context("cpu"):
        assert autocast_weight(partition, "cpu") is partition, "a ZeRO-3 partition is cast inside its forward"


def test_config_values_and_vllm_mapping():
    config = load_config(None, ["learner.dtype=bfloat16-autocast"])
    assert (config.learner.dtype, config.policy.dtype) == ("bfloat16-autocast", "auto")
    assert vllm_dtype("float32", on_gpu=True) == "float32"
    assert vllm_dtype("auto", on_gpu=True) == "bfloat16"
    assert vllm_dtype("auto", on_gpu=False) == ("bfloat16" if cpu_has_bf16() else "float32")


@pytest.fixture(scope="module")
def engines(tiny_policy):
    """The tiny policy's HF engine as ``policy.dtype=auto`` builds it on this machine, and fp32 / bf16-autocast
    engines on the same weights."""
    config = load_config(None, ["engine.backend=hf", "policy.dtype=auto"])
    tokenizer = load_tokenizer(str(tiny_policy))
    pair = {p.name: HFEngine(load_causal_lm(str(tiny_policy)), tokenizer, precision=p) for p in (FP32, BF16_AUTOCAST)}
    return build_hf_engine(config, str(tiny_policy), seed=0), pair, tokenizer


def ids(tokenizer, text: str, bos: bool = False) -> list[int]:
    return tokenizer(text, add_special_tokens=bos).input_ids


def test_auto_builds_the_sampler_at_this_cpus_precision(engines):
    auto, _, _ = engines
    assert auto.precision == (BF16_AUTOCAST if cpu_has_bf16() else FP32)
    assert next(auto.model.parameters()).dtype == torch.float32  # fp32 weights either way on a CPU


def test_scores_under_bf16_autocast_agree_with_fp32(engines):
    _, pair, tokenizer = engines
    group = PrefixGroup(prefix=ids(tokenizer, "The capital of", bos=True),
                        continuations=[ids(tokenizer, " France is Paris."), ids(tokenizer, " Paris.")],
                        num_scored=[3, 2])
    fp32, bf16 = (pair[name].continuation_log_probs([group])[0] for name in ("fp32", "bf16-autocast"))
    assert bf16.dtype == torch.float32
    gap = (bf16 - fp32).abs().max().item()
    assert 0 < gap < LOGP_TOLERANCE * 3  # autocast ran (not bit-identical), within 3 tokens' tolerance


def test_generation_under_bf16_autocast_gives_fp32_log_probs_near_its_scores(engines):
    _, pair, tokenizer = engines
    engine = pair["bf16-autocast"]
    prompt = ids(tokenizer, "The capital of", bos=True)
    [gen] = engine.generate([prompt], [6], SamplingSpec(temperature=1.0))
    assert len(gen.token_ids) == 6
    [scored] = pair["fp32"].continuation_log_probs([PrefixGroup(prompt, [gen.token_ids], [6])])
    assert abs(sum(gen.logprobs) - float(scored)) < 6 * LOGP_TOLERANCE


def test_local_cpu_uses_auto():
    config = load_config(Path(__file__).resolve().parents[2] / "jobs/configs/local_cpu.yaml")
    assert (config.policy.dtype, config.learner.dtype) == ("auto", "auto")
