"""The contract every generation backend meets, so that the rollout loop and the scorer never ask which one runs.

Log-probs are those of the *sampling* distribution, ``log_softmax(logits / T)`` at temperature T (raw logits
when greedy), which is what the learner's teacher-forced forward computes with the same T
(``sequence_log_probs(temperature=T)``), so the importance ratios compare like with like.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

FinishReason = Literal["stop", "eos", "length"]
WeightsLike = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class PolicyWeights:
    """What samplers load at a sync: HF-named full weights, or only the LoRA adapter (``adapter_config`` set)."""

    version: int
    tensors: dict[str, torch.Tensor]
    adapter_config: dict[str, Any] | None = None


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one turn: ``temperature`` 0 is greedy; generation ends at EOS or the first stop string."""

    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Generation:
    """One completion: the sampled ids (EOS included when it ended the turn), their log-probs under the sampling
    temperature, and why it ended; ``stop_string`` names the stop string whose text the last token completed."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_string: str | None = None


@dataclass(frozen=True)
class PrefixGroup:
    """Continuations of one shared prefix, each scored on its last ``num_scored[i]`` tokens (teacher-forced)."""

    prefix: list[int]
    continuations: list[list[int]]
    num_scored: list[int]

    def __post_init__(self) -> None:
        if len(self.continuations) != len(self.num_scored):
            raise ValueError(f"{len(self.continuations)} continuations but {len(self.num_scored)} num_scored")
        for cont, n in zip(self.continuations, self.num_scored, strict=True):
            if not 0 < n <= len(cont):
                raise ValueError(f"num_scored {n} outside 1..{len(cont)} (continuation length)")
        if not self.prefix:
            raise ValueError("the prefix must hold at least one token")


class GenerationEngine(Protocol):
    """A policy copy that generates, scores continuations and takes new weights while it runs."""

    @property
    def weight_version(self) -> int:
        """The version of the weights currently served (0 = as loaded)."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], spec: SamplingSpec
    ) -> list[Generation]:
        """One completion per prompt (token ids), at most ``max_tokens[i]`` tokens each, all in one batch."""
        ...

    def continuation_log_probs(self, groups: Sequence[PrefixGroup]) -> list[torch.Tensor]:
        """Per group, the summed log-prob of the scored tail of every continuation (a float32 tensor [k])."""
        ...

    def reseed(self, seed: int) -> None:
        """Restart sampling from ``seed``, so that what follows does not depend on what was sampled before."""
        ...

    def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Load new values for (a subset of) the parameters, by HF checkpoint name; then serve ``version``."""
        ...

    def load_adapter(self, path: str, version: int) -> None:
        """Serve the base weights plus the peft LoRA adapter saved at ``path``; then serve ``version``."""
        ...
