"""The HF engine on tiny random Gemma 3 models that use the real Gemma tokenizer."""

import collections
import copy

import pytest
import torch
from agent_helpers import tiny_gemma
from peft import LoraConfig, get_peft_model

from bridge_ray.algo.logprob import token_log_probs
from bridge_ray.engines.base import SamplingSpec
from bridge_ray.engines.hf import HFEngine
from bridge_ray.engines.precision import BF16_AUTOCAST


def teacher_forced(model, prompt, generated, temperature=1.0):
    """``log_softmax(logits / T)`` of the generated tokens: the sampling distribution at temperature T."""
    ids = torch.tensor([[*prompt, *generated]])
    with torch.no_grad():
        logits = model(ids).logits
    return token_log_probs(logits[:, :-1] / temperature, ids[:, 1:])[0, len(prompt) - 1 :]


@pytest.fixture(scope="module")
def prompts(gemma_tokenizer):
    # The longest prompt exceeds the tiny model's sliding window (8), so the hybrid cache path is exercised.
    return [gemma_tokenizer("Where was Ada Rowntree born? " * k).input_ids for k in (1, 2, 5)]


def test_sampled_logprobs_match_a_teacher_forced_forward(tiny_model, gemma_tokenizer, prompts):
    engine = HFEngine(tiny_model, gemma_tokenizer, batch_size=2, seed=1)
    for spec in (SamplingSpec(temperature=1.0), SamplingSpec(temperature=0.7, top_p=0.9), SamplingSpec(0.0)):
        gens = engine.generate(prompts, [12, 5, 9], spec)
        assert [len(g.token_ids) for g in gens] == [12, 5, 9]
        for prompt, gen in zip(prompts, gens, strict=True):
            assert gen.finish_reason == "length"
            # greedy (T = 0) records the raw model log-probs
            expected = teacher_forced(tiny_model, prompt, gen.token_ids, spec.temperature or 1.0)
            # fp32, same weights; only padding and cache layout differ from the plain forward
            torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-4, rtol=0)


def test_seeded_sampling_is_reproducible_and_greedy_is_deterministic(tiny_model, gemma_tokenizer, prompts):
    def run(seed, temperature):
        engine = HFEngine(tiny_model, gemma_tokenizer, seed=seed)
        return [g.token_ids for g in engine.generate(prompts, [8] * 3, SamplingSpec(temperature=temperature))]

    assert run(3, 1.0) == run(3, 1.0) != run(4, 1.0)
    assert run(3, 0.0) == run(4, 0.0)


def test_stop_strings_and_eos_end_the_turn(tiny_model, gemma_tokenizer, prompts):
    tok = gemma_tokenizer
    engine = HFEngine(tiny_model, tok)
    free = engine.generate(prompts[:1], [20], SamplingSpec(0.0))[0].token_ids
    # A stop string that straddles tokens j-1 and j and does not occur earlier: the turn must end at token j.
    j = next(j for j in range(3, 20) if len(tok.decode(free[j - 1 : j + 1]).strip()) >= 3)
    before, upto = tok.decode(free[:j]), tok.decode(free[: j + 1])
    stop = upto[len(before) - 1 :]
    assert stop not in before
    gen = engine.generate(prompts[:1], [20], SamplingSpec(0.0, stop=("never appears", stop)))[0]
    assert (gen.finish_reason, gen.stop_string, gen.token_ids) == ("stop", stop, free[: j + 1])

    eos_model = copy.deepcopy(tiny_model)
    eos_model.generation_config.eos_token_id = [tok.eos_token_id, free[4]]  # token 4 now counts as an EOS
    gen = HFEngine(eos_model, tok).generate(prompts[:1], [20], SamplingSpec(0.0))[0]
    assert (gen.finish_reason, gen.token_ids) == ("eos", free[:5])


def test_a_finished_row_leaves_the_batch_and_the_others_draw_as_before(tiny_model, gemma_tokenizer, prompts):
    """Decode steps run on the live rows only, and a row's sampled tokens do not depend on when the others end."""
    rows = []
    forward = tiny_model.forward
    tiny_model.forward = lambda *a, **k: rows.append((a[0] if a else k["input_ids"]).shape[0]) or forward(*a, **k)
    try:
        spec = SamplingSpec(temperature=1.0)
        short = HFEngine(tiny_model, gemma_tokenizer, batch_size=3, seed=7).generate(prompts, [2, 9, 5], spec)
        assert rows == [3, 3, 2, 2, 2, 1, 1, 1, 1]  # token k comes from forward k; rows end after 2, 5 and 9
        long = HFEngine(tiny_model, gemma_tokenizer, batch_size=3, seed=7).generate(prompts, [9, 9, 9], spec)
    finally:
        del tiny_model.forward
    assert short[1].token_ids == long[1].token_ids
    assert short[0].token_ids == long[0].token_ids[:2] and short[2].token_ids == long[2].token_ids[:5]
    torch.testing.assert_close(torch.tensor(short[1].logprobs), torch.tensor(long[1].logprobs), atol=1e-5, rtol=0)


def test_a_next_turn_reuses_the_last_turns_keys_and_values_exactly(gemma_tokenizer, prompts):
    """Turn 2 (turn 1's prompt, its tokens and an observation) encodes only the observation, and samples what a
    fresh encoding samples; a prompt that extends nothing, and any prompt after new weights, is encoded whole."""
    model = tiny_gemma(len(gemma_tokenizer), sliding_window=256)  # wide enough that reuse applies
    widths = []
    forward = model.forward
    model.forward = lambda *a, **k: widths.append((a[0] if a else k["input_ids"]).shape[1]) or forward(*a, **k)
    cached = HFEngine(model, gemma_tokenizer, batch_size=2, seed=5)
    fresh = HFEngine(model, gemma_tokenizer, batch_size=2, seed=5, prefix_cache=False)
    observation = gemma_tokenizer(" <information>Ada Rowntree was born in Thornwick.</information>").input_ids[1:]
    for spec in (SamplingSpec(0.0), SamplingSpec(temperature=1.0)):
        first = cached.generate(prompts, [6, 4, 5], spec)
        assert [g.token_ids for g in first] == [g.token_ids for g in fresh.generate(prompts, [6, 4, 5], spec)]
        turn2 = [[*p, *g.token_ids, *observation[: 3 + i]] for i, (p, g) in enumerate(zip(prompts, first, strict=True))]
        turn2.append(gemma_tokenizer("An unrelated question?").input_ids)
        widths.clear()
        again = cached.generate(turn2, [5] * 4, spec)
        prefill = [w for w in widths if w > 1]
        assert max(prefill) < min(len(p) for p in turn2[:3])  # the extending prompts encoded only their new tokens
        reference = fresh.generate(turn2, [5] * 4, spec)
        for got, want in zip(again, reference, strict=True):
            assert got.token_ids == want.token_ids
            torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-5, rtol=0)
    cached.update_weights(tiny_gemma(len(gemma_tokenizer), seed=1, sliding_window=256).state_dict(), version=1)
    turn3 = [*turn2[0], *again[0].token_ids, *observation]  # extends what the old weights encoded
    widths.clear()
    after = cached.generate([turn3], [5], SamplingSpec(0.0))[0]
    assert widths[0] == len(turn3)  # encoded whole: the old weights' keys are gone
    torch.testing.assert_close(torch.tensor(after.logprobs), teacher_forced(model, turn3, after.token_ids),
                               atol=1e-4, rtol=0)


def test_full_weight_update_changes_generation_and_version(make_tiny, gemma_tokenizer, prompts):
    model = make_tiny(0)
    engine = HFEngine(model, gemma_tokenizer)
    before = engine.generate(prompts, [10] * 3, SamplingSpec(0.0))
    new = make_tiny(1).state_dict()
    engine.update_weights(new, version=7)
    after = engine.generate(prompts, [10] * 3, SamplingSpec(0.0))
    assert engine.weight_version == 7
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    reference = make_tiny(1)
    for prompt, gen in zip(prompts, after, strict=True):  # the engine now serves exactly the new weights
        torch.testing.assert_close(torch.tensor(gen.logprobs), teacher_forced(reference, prompt, gen.token_ids),
                                   atol=1e-4, rtol=0)
    with pytest.raises(KeyError, match="no parameters named"):
        engine.update_weights({"model.not_a_layer.weight": torch.zeros(1)}, version=8)
    with pytest.raises(ValueError, match="expected"):
        engine.update_weights({"model.norm.weight": torch.zeros(3)}, version=8)
    assert engine.weight_version == 7


def lora_adapters(base, tmp_path, seeds=(1, 2), targets=("q_proj", "v_proj", "down_proj")):
    """``(path, peft model)`` of LoRA adapters on ``base`` with factors large enough to change greedy decoding."""
    out = []
    for seed in seeds:
        torch.manual_seed(seed)
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), init_lora_weights=False)
        peft_model = get_peft_model(copy.deepcopy(base), lora)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.5)
        peft_model.save_pretrained(tmp_path / f"a{seed}")
        out.append((tmp_path / f"a{seed}", peft_model.eval()))
    return out


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "peft"])
@pytest.mark.filterwarnings("error:Already found a `peft_config`")  # silenced: the old adapter goes right after
def test_lora_adapter_is_served_and_replaced(merge, make_tiny, gemma_tokenizer, prompts, tmp_path, capsys, caplog):
    base = make_tiny(0)
    engine = HFEngine(copy.deepcopy(base), gemma_tokenizer, merge_adapter=merge)
    plain = engine.generate(prompts, [10] * 3, SamplingSpec(0.0))
    paths = lora_adapters(base, tmp_path)
    for version, (path, peft_model) in enumerate(paths, start=3):
        engine.load_adapter(str(path), version)
        gens = engine.generate(prompts, [10] * 3, SamplingSpec(0.0))
        assert engine.weight_version == version
        assert [g.token_ids for g in gens] != [g.token_ids for g in plain]
        for prompt, gen in zip(prompts, gens, strict=True):  # merged or not, the adapter's own distribution
            torch.testing.assert_close(torch.tensor(gen.logprobs), teacher_forced(peft_model, prompt, gen.token_ids),
                                       atol=1e-4, rtol=0)
    if merge:  # the second adapter merged into W0 itself, not into the first merge: exactly W0 + s·BA
        expected = copy.deepcopy(paths[-1][1]).merge_and_unload().state_dict()
        served = engine.model.state_dict()
        assert not any("lora" in name for name in served) and served.keys() == expected.keys()
        for name, value in served.items():
            torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=0)
            if "q_proj" not in name and "v_proj" not in name and "down_proj" not in name:
                assert torch.equal(value, base.state_dict()[name])  # untouched layers bit for bit
    else:
        assert list(engine.model.peft_config) == ["policy-v4-2"]  # the previous adapter was dropped
    engine.load_adapter(str(paths[-1][0]), 4)  # the same version again: a restarted sampler's re-sent push
    assert engine.weight_version == 4
    assert merge or list(engine.model.peft_config) == ["policy-v4-3"]
    # transformers' load report would call the replaced adapter's factors MISSING and "newly initialized"
    assert "MISSING" not in capsys.readouterr().err + caplog.text

    from safetensors.torch import load_file, save_file  # an adapter file that lacks one factor: refused, nothing lost
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((paths[0][0] / "adapter_config.json").read_text())
    weights = load_file(paths[0][0] / "adapter_model.safetensors")
    dropped = next(key for key in weights if "lora_B" in key)
    save_file({k: v for k, v in weights.items() if k != dropped}, broken / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"broken: 1 of the factors .* not in its weights file, e\.g\. .*lora_B"):
        engine.load_adapter(str(broken), 5)
    assert engine.weight_version == 4
    assert merge or list(engine.model.peft_config) == ["policy-v4-3"]
    gens = engine.generate(prompts, [10] * 3, SamplingSpec(0.0))
    for prompt, gen in zip(prompts, gens, strict=True):  # still the adapter of version 4
        torch.testing.assert_close(torch.tensor(gen.logprobs), teacher_forced(paths[-1][1], prompt, gen.token_ids),
                                   atol=1e-4, rtol=0)


def test_a_merged_adapter_gives_way_to_whole_weights_and_refuses_what_it_cannot_merge(make_tiny, gemma_tokenizer,
                                                                                      tmp_path):
    base = make_tiny(0)
    engine = HFEngine(copy.deepcopy(base), gemma_tokenizer)
    (path, _), = lora_adapters(base, tmp_path, seeds=(1,))
    engine.load_adapter(str(path), 1)
    pushed = make_tiny(3).state_dict()
    engine.update_weights({k: v for k, v in pushed.items() if "q_proj" not in k}, version=2)  # all but q_proj
    served = engine.model.state_dict()
    for name, value in served.items():  # the pushed weights, and W0 (not W0 + ΔW) where nothing was pushed
        assert torch.equal(value, base.state_dict()[name] if "q_proj" in name else pushed[name]), name

    import json  # a DoRA adapter merges into another weight than W0 + s·BA: refused by name, before any change
    config = json.loads((path / "adapter_config.json").read_text())
    dora = tmp_path / "dora"
    dora.mkdir()
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    (dora / "adapter_model.safetensors").write_bytes((path / "adapter_model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"dora/adapter_config.json: use_dora=True .*merge_adapter=false"):
        engine.load_adapter(str(dora), 3)
    assert engine.weight_version == 2 and all(torch.equal(v, served[k]) for k, v in engine.model.state_dict().items())


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "peft"])
def test_autocast_casts_each_weight_once_per_generation_with_an_adapter(merge, make_tiny, gemma_tokenizer, prompts,
                                                                       tmp_path):
    # peft freezes the base weights, and autocast keeps the cast of a frozen weight for no longer than one call:
    # without the engine's fix every decode step casts every matrix again. Merged, the weights stay the model's own.
    from torch.utils._python_dispatch import TorchDispatchMode

    base = make_tiny(0)
    get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "down_proj"])).save_pretrained(
        tmp_path / "a")
    engine = HFEngine(copy.deepcopy(base), gemma_tokenizer, precision=BF16_AUTOCAST, merge_adapter=merge)
    engine.load_adapter(str(tmp_path / "a"), 1)
    matrices = {p.data_ptr(): name for name, p in engine.model.named_parameters() if p.dim() == 2}
    casts: collections.Counter[str] = collections.Counter()

    class CountWeightCasts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in matrices:
                casts[matrices[args[0].data_ptr()]] += 1
            return func(*args, **(kwargs or {}))

    with CountWeightCasts():
        gens = engine.generate(prompts, [6] * 3, SamplingSpec(0.0))
    assert [len(g.token_ids) for g in gens] == [6] * 3
    adapted = ("lora_A", "base_layer") if not merge else ("q_proj", "down_proj")
    assert all(any(part in name for name in casts) for part in adapted)
    assert merge != any("lora" in name for name in casts)
    assert max(casts.values()) == 1, casts.most_common(3)
