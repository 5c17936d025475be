"""vLLM worker extension: the public hook (``worker_extension_cls`` + ``LLM.collective_rpc``) for loading new
policy weights into a running engine. Imported by qualified name inside vLLM's workers; keep it light."""

from __future__ import annotations

from collections.abc import Iterable

import torch


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self.model_runner`` is the worker's."""

    def bridge_ray_load_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy HF-named tensors into the served model (vLLM maps names and fuses q/k/v itself); returns how many
        parameters were written. Unknown names raise inside vLLM's loader."""
        return len(self.model_runner.model.load_weights(weights=list(named)))
