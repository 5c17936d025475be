"""Merging a peft LoRA adapter into the weights: what it computes, and the adapters it refuses."""

import copy
import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

from bridge_ray.engines.lora_merge import MergedLora, lora_scaling, read_lora


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.up_proj, self.out = torch.nn.Linear(6, 4), torch.nn.Linear(6, 10), torch.nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.up_proj(x))) + self.q_proj(x).sum(-1, keepdim=True)


def saved_adapter(model, path, **lora):
    torch.manual_seed(0)
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(init_lora_weights=False, **lora))
    peft_model.save_pretrained(path)
    return peft_model.eval()


@pytest.mark.parametrize("rslora", [False, True])
def test_the_merge_computes_what_peft_serves_and_restores_w0_bit_for_bit(rslora, tmp_path):
    torch.manual_seed(1)
    model = Block()
    w0 = copy.deepcopy(model.state_dict())
    peft_model = saved_adapter(model, tmp_path / "a", r=2, lora_alpha=5, target_modules=["q_proj", "up_proj"],
                               use_rslora=rslora)
    factors = read_lora(tmp_path / "a", model)
    assert sorted(factors) == ["q_proj", "up_proj"]
    assert factors["q_proj"].scaling == lora_scaling(5, 2, rslora) == (5 / 2**0.5 if rslora else 2.5)
    merged = MergedLora(model)
    merged.merge(factors)
    x = torch.randn(7, 6)
    torch.testing.assert_close(model(x), peft_model(x), atol=1e-6, rtol=0)
    assert torch.equal(model.out.weight, w0["out.weight"])  # a layer the adapter does not target is untouched
    merged.restore()
    assert all(torch.equal(v, w0[k]) for k, v in model.state_dict().items())


def test_adapters_a_merge_cannot_reproduce_are_refused_naming_the_file(tmp_path):
    model = Block()
    saved_adapter(model, tmp_path / "a", r=2, lora_alpha=4, target_modules=["q_proj"])
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    tensors = load_file(tmp_path / "a" / "adapter_model.safetensors")

    def variant(name, config_changes=None, tensors_=None):
        path = tmp_path / name
        path.mkdir()
        (path / "adapter_config.json").write_text(json.dumps({**config, **(config_changes or {})}))
        save_file(tensors if tensors_ is None else tensors_, path / "adapter_model.safetensors")
        return path

    cases = [
        (variant("bias", {"bias": "all"}), r"bias/adapter_config.json: bias='all' is not merged"),
        (variant("pattern", {"rank_pattern": {"q_proj": 4}}), r"pattern/adapter_config.json: rank_pattern="),
        (variant("nothing", {"target_modules": ["k_proj"]}), r"nothing: its target_modules name no linear layer"),
        (variant("stray", tensors_={**tensors, "base_model.model.up_proj.lora_A.weight": torch.zeros(2, 6)}),
         r"stray: 1 tensors fit no layer .* e\.g\. base_model\.model\.up_proj\.lora_A\.weight"),
        (variant("shape", tensors_={k: v[:, :5].contiguous() if "lora_A" in k else v for k, v in tensors.items()}),
         r"shape: q_proj's factors \(4, 2\) @ \(2, 5\) do not make its weight's \(4, 6\)"),
    ]
    for path, message in cases:
        with pytest.raises(ValueError, match=message):
            read_lora(path, model)
    with pytest.raises(ValueError, match=r"empty: no adapter_config.json"):
        read_lora(tmp_path / "empty", model)
