"""The compute precision of every model that runs: one rule for the learner, the warm-up, the sampler and the scorer.

A :class:`Precision` is the dtype the weights are held in and the dtype the matmuls run in; when they differ the
forward runs under ``torch.autocast`` (fp32 master weights, bf16 matmuls). ``auto`` picks, per device:

- a GPU: bf16 weights (the learner's optimizer keeps fp32 master copies through DeepSpeed's bf16 mode);
- a CPU with bf16 instructions (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``): fp32 weights under bf16
  autocast, about twice fp32's matmul rate there (measured 195 against 90 GFLOP/s on one core);
- any other CPU (and any CPU off Linux, where the flags are not read): fp32.

Log-probs are always taken in fp32: the LM head's output is upcast before its log-softmax
(:func:`~bridge_ray.engines.lm_head.head_logits`, :func:`~bridge_ray.algo.logprob.token_log_probs`). An explicit bf16
value on a CPU without bf16 instructions is refused: torch would emulate it, slower than fp32.
"""

from __future__ import annotations

import sys
import weakref
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

# /proc/cpuinfo flags of CPUs with native bf16 matmuls (AVX-512 BF16: Cooper Lake, Zen 4 on; AMX: Sapphire Rapids on).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class Precision:
    """Weights held in ``weights``, matmuls run in ``compute`` (under autocast when the two differ)."""

    weights: torch.dtype
    compute: torch.dtype

    @property
    def autocast(self) -> bool:
        return self.compute != self.weights

    @property
    def name(self) -> str:
        """``fp32``, ``bf16``, ``fp16`` or ``bf16-autocast``: for logs and cache keys."""
        return f"{_SHORT[self.compute]}-autocast" if self.autocast else _SHORT[self.weights]

    def context(self, device_type: str) -> AbstractContextManager:
        """What a forward on ``device_type`` runs in: autocast to ``compute``, or nothing.

        Wrap a whole call (all of a generation's decode steps, not each one): autocast casts each weight once
        per context, not once per forward, but only a weight that is a leaf requiring grad (the HF engine marks
        its frozen weights so).
        """
        if not self.autocast:
            return nullcontext()
        return torch.autocast(device_type, dtype=self.compute)

    def with_fp32_weights(self) -> Precision:
        """The same matmul precision with fp32 weights, for a plain torch optimizer (no fp32 master copy of its
        own): bf16 weights become fp32 weights under bf16 autocast."""
        return Precision(torch.float32, self.compute)


# A frozen weight's cast for autocast while the weight is unchanged: {id(weight): ((data_ptr, version, dtype), cast)},
# an entry dropped with its weight (tensors compare elementwise, so no WeakKeyDictionary).
_FROZEN_CASTS: dict[int, tuple[tuple[int, int, torch.dtype], torch.Tensor]] = {}


def autocast_weight(weight: torch.Tensor, device_type: str) -> torch.Tensor:
    """``weight`` as autocast would cast it for a matmul on ``device_type``, cast once while it stays unchanged.

    Autocast caches only the casts of leaf weights that require grad, so a frozen weight (the tied embedding / LM
    head of the warm-up, a LoRA learner's base) is cast again at every forward: for Gemma 3 270M's 168M-value head
    a gigabyte of memory traffic each time. The cast is the same rounding autocast does, so results are bitwise
    those of autocast's own cast. A weight that requires grad or is a ZeRO-3 partition, or no autocast, passes
    through.
    """
    if weight.requires_grad or hasattr(weight, "ds_id") or not torch.is_autocast_enabled(device_type):
        return weight  # a ZeRO-3 partition (ds_id) is whole only inside its module's forward: autocast casts it there
    dtype = torch.get_autocast_dtype(device_type)
    key = (weight.data_ptr(), weight._version, dtype)
    cached = _FROZEN_CASTS.get(id(weight))
    if cached is None:
        weakref.finalize(weight, _FROZEN_CASTS.pop, id(weight), None)
    if cached is None or cached[0] != key:
        cached = _FROZEN_CASTS[id(weight)] = (key, weight.detach().to(dtype))
    return cached[1]


FP32 = Precision(torch.float32, torch.float32)
BF16 = Precision(torch.bfloat16, torch.bfloat16)
FP16 = Precision(torch.float16, torch.float16)
BF16_AUTOCAST = Precision(torch.float32, torch.bfloat16)

# Explicit values of the dtype keys (torch's names; the short ones are the former spellings of learner.dtype).
EXPLICIT = {
    "fp32": FP32,
    "float32": FP32,
    "bf16": BF16,
    "bfloat16": BF16,
    "float16": FP16,
    "bf16-autocast": BF16_AUTOCAST,
    "bfloat16-autocast": BF16_AUTOCAST,
}


def has_bf16_flags(cpuinfo: str) -> bool:
    """Whether the ``flags`` lines of a ``/proc/cpuinfo`` text list a native bf16 instruction set."""
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.partition(":")[2].split()}
    return any(flag in flags for flag in BF16_CPU_FLAGS)


@cache
def cpu_has_bf16() -> bool:
    """Whether this machine's CPU runs bf16 matmuls natively (Linux only: elsewhere the answer is no)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return has_bf16_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return False


def cpu_kernels() -> str:
    """The instruction set of torch's CPU kernels here (``AVX2``, ``AVX512``, ...), for a run's records.

    fp32 results depend on it, not only on the seed: the same warm-up trained on a CPU with AVX-512 and on one
    with AVX2 alone ended in different weights (each the same bit for bit when repeated on its own CPU), and
    evaluated to different tables. Figures are comparable digit for digit between runs with the same value.
    """
    return torch.backends.cpu.get_cpu_capability()


def resolve_precision(value: str, key: str, device_type: str, cpu_bf16: bool | None = None) -> Precision:
    """The precision config key ``key`` (set to ``value``) means for a model computing on ``device_type``.

    ``cpu_bf16`` says whether the CPU has bf16 instructions (None: :func:`cpu_has_bf16`).
    """
    on_cpu = device_type == "cpu"
    if on_cpu and cpu_bf16 is None:
        cpu_bf16 = cpu_has_bf16()
    if value == "auto":
        if not on_cpu:
            return BF16
        return BF16_AUTOCAST if cpu_bf16 else FP32
    if value not in EXPLICIT:
        raise ValueError(f"{key}={value!r}: expected auto or one of {sorted(EXPLICIT)}")
    precision = EXPLICIT[value]
    if on_cpu and torch.bfloat16 in (precision.weights, precision.compute) and not cpu_bf16:
        raise ValueError(
            f"{key}={value}: this CPU has no bf16 instructions ({' or '.join(BF16_CPU_FLAGS)} in /proc/cpuinfo), "
            f"so bf16 would be emulated, slower than fp32; use auto or fp32"
        )
    return precision


def vllm_dtype(value: str, on_gpu: bool) -> str:
    """``policy.dtype`` as vLLM's ``dtype`` (vLLM holds one dtype, no autocast): auto is bf16 where bf16 runs
    natively (a GPU, a CPU with bf16 instructions), else float32."""
    if value != "auto":
        return value
    return "bfloat16" if on_gpu or cpu_has_bf16() else "float32"
