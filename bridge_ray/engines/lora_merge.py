"""A LoRA adapter served merged into the weights it adapts: ``W = W0 + s·B·A``.

Served unmerged (peft), every adapted projection runs three matmuls (``x·W0``, ``x·A``, then ``·B``) and adds,
at every decode step and scoring forward: on 2 CPU cores a third more time per sampler call than the base model
(docs/results/speed.md). Merged, it runs one, as the base model does. The base weights ``W0`` are kept aside, so
each new adapter is merged from them and never from the previous merge: no rounding accumulates over the rounds.

Merging rounds ``W0 + s·B·A`` to the weights' dtype once. In fp32 that is far below anything sampling resolves;
in bf16 weights a small delta can round away, which is why the HF engine can also serve the adapter unmerged
(``engine.hf.merge_adapter``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."  # peft's name for the wrapped model in the keys it saves


@dataclass(frozen=True)
class LoraFactors:
    """The factors of one adapted linear layer; ``delta() = scaling · B @ A`` has the layer's weight's shape."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scaling: float

    def delta(self) -> torch.Tensor:
        return self.scaling * (self.b.float() @ self.a.float())


def lora_scaling(alpha: float, rank: int, rslora: bool) -> float:
    """LoRA's ``α / r`` (Hu et al., 2021), or rsLoRA's ``α / √r``."""
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def _key(layer: str, factor: str) -> str:
    """The key of ``layer``'s LoRA factor (``A`` or ``B``) in a peft adapter's weights file."""
    return f"{_PREFIX}{layer}.lora_{factor}.weight"


def read_lora(path: str | Path, model: torch.nn.Module) -> dict[str, LoraFactors]:
    """The factors of the peft LoRA adapter at ``path`` for each linear layer of ``model`` it adapts.

    Only what a merge reproduces exactly is accepted: plain LoRA on ``nn.Linear`` layers (no DoRA, no trained
    bias or ``modules_to_save``, no per-layer rank or alpha). A layer its ``target_modules`` names must have both
    factors in the weights file, and every factor must fit a layer of ``model``; the error names the file.
    """
    from peft import LoraConfig  # not at import: the job driver imports this module, without peft
    from peft.tuners.tuners_utils import check_target_module_exists  # as above

    path = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise ValueError(f"LoRA adapter {path}: no {name}")
    config = LoraConfig.from_pretrained(str(path))
    unmergeable = {"use_dora": config.use_dora, "bias": config.bias != "none", "fan_in_fan_out": config.fan_in_fan_out,
                   "modules_to_save": config.modules_to_save, "rank_pattern": config.rank_pattern,
                   "alpha_pattern": config.alpha_pattern}
    for field, present in unmergeable.items():
        if present:
            raise ValueError(f"LoRA adapter {path / CONFIG_FILE}: {field}={getattr(config, field)!r} is not merged "
                             "here; serve it unmerged (engine.hf.merge_adapter=false)")
    scaling = lora_scaling(config.lora_alpha, config.r, bool(config.use_rslora))
    tensors = load_file(str(path / WEIGHTS_FILE))
    layers = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    targets = [name for name in layers if check_target_module_exists(config, name)]
    if not targets:
        raise ValueError(f"LoRA adapter {path}: its target_modules name no linear layer of the model")
    missing = [_key(name, f) for name in targets for f in "AB" if _key(name, f) not in tensors]
    if missing:
        raise ValueError(f"LoRA adapter {path}: {len(missing)} of the factors its {CONFIG_FILE} names are not in its "
                         f"weights file, e.g. {missing[0]}")
    stray = sorted(set(tensors) - {_key(name, f) for name in targets for f in "AB"})
    if stray:
        raise ValueError(f"LoRA adapter {path}: {len(stray)} tensors fit no layer its {CONFIG_FILE} targets, "
                         f"e.g. {stray[0]}")
    factors = {name: LoraFactors(tensors[_key(name, "A")], tensors[_key(name, "B")], scaling) for name in targets}
    for name, f in factors.items():
        shape = tuple(layers[name].weight.shape)
        if (f.b.shape[0], f.a.shape[1]) != shape or f.a.shape[0] != f.b.shape[1]:
            raise ValueError(f"LoRA adapter {path}: {name}'s factors {tuple(f.b.shape)} @ {tuple(f.a.shape)} do not "
                             f"make its weight's {shape}")
    return factors


class MergedLora:
    """Serves one LoRA adapter at a time merged into ``model``'s weights, keeping each adapted weight's ``W0``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._base: dict[str, torch.Tensor] = {}  # layer name -> its weight before any merge

    @torch.no_grad()
    def merge(self, factors: dict[str, LoraFactors]) -> None:
        """Serve ``factors`` (from :func:`read_lora`): each adapted layer ``W0 + ΔW`` from its kept ``W0``, any
        layer the previous adapter adapted and this one does not back to ``W0``."""
        layers = dict(self.model.named_modules())
        for name in set(self._base) - set(factors):
            layers[name].weight.copy_(self._base.pop(name))
        for name, f in factors.items():
            weight = layers[name].weight
            base = self._base.setdefault(name, weight.detach().clone())  # W0: copied at the layer's first merge
            weight.copy_((base.float() + f.delta().to(weight.device)).to(weight.dtype))

    @torch.no_grad()
    def restore(self) -> None:
        """The base weights again, bit for bit."""
        layers = dict(self.model.named_modules())
        for name, base in self._base.items():
            layers[name].weight.copy_(base)
        self._base = {}
