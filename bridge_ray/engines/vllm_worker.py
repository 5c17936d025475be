"""vLLM worker extension: the public hook (``worker_extension_cls`` + ``LLM.collective_rpc``) for loading new
policy weights into a running engine and reseeding its sampling. Imported by qualified name inside vLLM's workers;
keep it light."""

from __future__ import annotations

from collections.abc import Iterable

import torch


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``self`` is the worker)."""

    def bridge_ray_load_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Write HF-named tensors into the served model in place; returns how many were given.

        vLLM's in-place reload maps the names, fuses q/k/v and gate/up, and sees through LoRA wrappers. It
        processes a fused layer from the parts given in one call, so each call must carry all the parts of
        every fused layer it touches (a full state dict, or buckets cut at module boundaries, do).
        """
        named = list(named)
        _check_fused_groups_complete(self.model_runner.model, [name for name, _ in named])
        self.reload_weights(weights_iterator=named, is_checkpoint_format=True)
        return len(named)

    def bridge_ray_reseed(self, seed: int) -> None:
        """Seed torch's default generators, which sample every request that carries no seed of its own."""
        torch.manual_seed(seed)


def _check_fused_groups_complete(model: torch.nn.Module, names: list[str]) -> None:
    given = set(names)
    for parts in getattr(model, "packed_modules_mapping", {}).values():
        for name in names:
            module, _, leaf = name.rpartition(".")
            parent, _, part = module.rpartition(".")
            if part in parts:
                missing = [f"{parent}.{p}.{leaf}" for p in parts if f"{parent}.{p}.{leaf}" not in given]
                if missing:
                    raise ValueError(f"weight update carries {name} but not {missing}: vLLM fuses them into one "
                                     "layer, so send them in the same update")
