"""DeepSpeed pieces of the policy learner: engine config and construction, weight export, safe state loading.

Imported only inside learner processes: importing DeepSpeed picks its accelerator (``DS_ACCELERATOR``)
once per process, and the job driver, which imports the learner's module, loads no model library.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file
from transformers.integrations import HfDeepSpeedConfig

from bridge_ray.config import LearnerConfig, OptimConfig, PolicyLoraConfig

# The only non-tensor types DeepSpeed's ZeRO state files hold (found by inspecting files written by
# stages 0-3, fp32 and bf16); anything else in a state file is refused instead of unpickled.
DEEPSPEED_STATE_GLOBALS = (LossScaler, ZeroStageEnum, fragment_address)
STATE_ENUMS = (ZeroStageEnum,)


def state_enum_member(cls: type, name: str) -> Any:
    """What a state file's ``getattr(cls, name)`` unpickles to, for the state's enums alone.

    Early Python 3.11 releases (3.11.2 among them, not 3.11.7) pickle an enum member as ``getattr(EnumClass,
    "name")``, so a ZeRO-3 state saved there holds ``builtins.getattr``; allowing getattr itself would reach any
    attribute.
    """
    if cls not in STATE_ENUMS:
        raise ValueError(f"getattr({getattr(cls, '__qualname__', cls)!r}, {name!r}) is not a DeepSpeed state enum")
    return getattr(cls, name)


def engine_config(learner: LearnerConfig, optim: OptimConfig, world_size: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed config: we own the accumulation boundary (one ``step()`` per mini-batch)."""
    return {
        "train_micro_batch_size_per_gpu": learner.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": learner.micro_batch_size * world_size,
        # backward() only accumulates; step() closes the mini-batch whatever its micro-batch count.
        "managed_gradient_accumulation": False,
        "gradient_clipping": optim.grad_clip,
        "bf16": {"enabled": bf16},
        "zero_optimization": {"stage": learner.zero_stage},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def reference_config(learner: LearnerConfig, world_size: int, bf16: bool) -> dict[str, Any]:
    """A frozen model's engine: partitioned like the policy under ZeRO-3, replicated otherwise."""
    return {
        "train_micro_batch_size_per_gpu": learner.micro_batch_size,
        "train_batch_size": learner.micro_batch_size * world_size,
        "bf16": {"enabled": bf16},
        "zero_optimization": {"stage": 3 if learner.zero_stage == 3 else 0},
        "steps_per_print": 2**31 - 1,
    }


def init_distributed(on_gpu: bool) -> None:
    """Join the process group the ``MASTER_ADDR``/``RANK``/``WORLD_SIZE`` environment describes (NCCL or gloo)."""
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", auto_mpi_discovery=False)


def zero3_loading(config: dict[str, Any]) -> HfDeepSpeedConfig:
    """While the returned object lives, ``from_pretrained`` loads straight into ZeRO-3 partitions."""
    return HfDeepSpeedConfig(config)


def with_lora(model: torch.nn.Module, lora: PolicyLoraConfig) -> PeftModel:
    """``model`` wrapped by peft with ``learner.lora``'s adapters, the only trainable weights."""
    return get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))


def initialize(model: torch.nn.Module, config: dict[str, Any], optimizer: Any = None, lr_scheduler: Any = None) -> Any:
    """The DeepSpeed engine wrapping ``model`` (with ``optimizer`` and ``lr_scheduler`` when it trains)."""
    return deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, config=config)[0]


class RestrictedCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine with pickle restricted to tensors, containers and the ZeRO types.

    DeepSpeed loads its state with ``weights_only=False``, which runs arbitrary code from a crafted file.
    Every state file DeepSpeed reads during ``load_checkpoint`` goes through this ``load``.
    """

    def load(self, path: str, map_location: Any = None) -> Any:
        with torch.serialization.safe_globals([*DEEPSPEED_STATE_GLOBALS, (state_enum_member, "builtins.getattr")]):
            try:
                return torch.load(path, map_location=map_location, weights_only=True)
            except Exception as exc:  # torch raises UnpicklingError or RuntimeError depending on the payload
                raise ValueError(f"refusing to load DeepSpeed state {path}: {exc}") from None


def exclude_tied_frozen_weights(engine: Any) -> None:
    """Make ``engine.save_checkpoint(exclude_frozen_parameters=True)`` leave out every frozen weight.

    DeepSpeed drops the frozen entries it finds through ``named_parameters()``, which names a tied weight once, so
    the tied copy stayed: every LoRA checkpoint of Gemma 3 270M held its LM head (the 168M-weight embedding, 671 MB
    of the 686 MB state file), and a tied Qwen2.5-3B's would hold 311M weights. A resume loads the module state
    non-strictly and keeps the base weights it was built with, so nothing needs them in the file.
    """
    module_state_dict = engine.module_state_dict

    def without_frozen(*args: Any, exclude_frozen_parameters: bool = False, **kwargs: Any) -> Any:
        state = module_state_dict(*args, exclude_frozen_parameters=exclude_frozen_parameters, **kwargs)
        if exclude_frozen_parameters:
            for name, param in engine.module.named_parameters(remove_duplicate=False):
                if not param.requires_grad:
                    state.pop(name, None)
        return state

    engine.module_state_dict = without_frozen


def gathered(params: Iterable[torch.nn.Parameter], zero3: bool) -> Any:
    """Context in which ZeRO-3 partitioned ``params`` are whole on every rank (collective); a no-op otherwise."""
    return deepspeed.zero.GatheredParameters(list(params), enabled=zero3)


def export_weights(module: torch.nn.Module, zero3: bool, keep: bool, merge_lora: bool) -> dict[str, torch.Tensor]:
    """HF-named full weights on CPU, gathered module by module (ZeRO-3 never holds the whole model at once).

    Every rank must call this (gathering is collective); only ranks with ``keep`` copy tensors out.
    Tied parameters appear once, under their first name. ``merge_lora``: ``module`` is a peft model
    whose LoRA layers are folded into their base weights with peft's own ``get_delta_weight``, so the
    result loads into the plain architecture.
    """
    base = module.get_base_model() if merge_lora else module
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for prefix, sub in base.named_modules():
        dot = f"{prefix}." if prefix else ""
        if merge_lora and isinstance(sub, LoraLayer):
            params = list(sub.parameters())
            seen.update(id(p) for p in params)
            with gathered(params, zero3), torch.no_grad():
                if keep:
                    layer = sub.get_base_layer()
                    out[f"{dot}weight"] = (layer.weight + sub.get_delta_weight("default")).cpu()
                    if getattr(layer, "bias", None) is not None:
                        out[f"{dot}bias"] = layer.bias.detach().cpu().clone()
            continue
        own = [(name, p) for name, p in sub.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in own)
        if own:
            with gathered([p for _, p in own], zero3):
                if keep:
                    out.update({f"{dot}{name}": p.detach().cpu().clone() for name, p in own})
    return out


def export_adapter(module: torch.nn.Module, zero3: bool, keep: bool) -> dict[str, torch.Tensor]:
    """The trainable LoRA factors of a peft model, in peft's adapter-file naming (collective under ZeRO-3)."""
    trainable = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    with gathered([p for _, p in trainable], zero3):
        state = {name: p.detach().cpu().clone() for name, p in trainable} if keep else {}
    return get_peft_model_state_dict(module, state_dict=state) if keep else {}


def save_adapter(module: torch.nn.Module, adapter: dict[str, torch.Tensor], directory: Path) -> None:
    """Write ``adapter`` (from :func:`export_adapter`) as a peft adapter directory ``PeftModel`` loads."""
    directory.mkdir(parents=True, exist_ok=True)
    module.peft_config["default"].save_pretrained(str(directory))
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(directory / "adapter_model.safetensors"))
