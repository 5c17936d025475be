"""The device figures benchmarks report, measured one way for all of them: a matmul's peak rate and the model FLOPs
that MFU sets against it, the peak memory of a process, the wall and CPU seconds of a call."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import AutoConfig, AutoModelForCausalLM

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer read after it counts that work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[..., T], *args: Any) -> tuple[T, tuple[float, float]]:
    """``fn(*args)`` and the (wall, process CPU) seconds it took: CPU time is the steadier figure on a machine
    that other processes share."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, (time.perf_counter() - wall, time.process_time() - cpu)


def matmul_tflops(device: torch.device, dtype: torch.dtype, windows: int = 5, seconds: float = 0.2) -> float:
    """The peak rate of a square matmul in ``dtype`` (8192 on CUDA, 1024 on CPU): the best of ``windows`` timed
    windows of at least ``seconds`` each, after warm-up.

    A peak, so the best window rather than one short timing (a 1024 matmul takes 2 ms with AMX). On a shared VM
    the rate can still differ between processes: 370-400 or 940-1130 GFLOP/s for the same bf16 matmul on the
    same 2 threads of one 2-core Xeon, within a minute.
    """
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    runs = 1
    while _timed_matmuls(a, b, runs) < seconds:  # a window's size
        runs *= 2
    fastest = min(_timed_matmuls(a, b, runs) for _ in range(windows))
    return 2 * n**3 * runs / fastest / 1e12


def _timed_matmuls(a: torch.Tensor, b: torch.Tensor, runs: int) -> float:
    synchronize(a.device)
    start = time.perf_counter()
    for _ in range(runs):
        a @ b
    synchronize(a.device)
    return time.perf_counter() - start


def matmul_gflops(dtype: torch.dtype, threads: int) -> float:
    """This machine's dense matmul rate in ``dtype`` on ``threads`` CPU threads (a learner's), in GFLOP/s."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return matmul_tflops(torch.device("cpu"), dtype) * 1e3
    finally:
        torch.set_num_threads(previous)


def parameter_split(model: Any) -> tuple[int, int]:
    """(transformer body, LM head) parameter counts of a causal LM: the body runs on every attended token, the head
    only on the tokens a log-prob is taken of. The input embedding is a lookup, not a matmul: counted in neither,
    unless it is the tied head."""
    head = model.get_output_embeddings().weight
    embeddings = model.get_input_embeddings().weight
    untied = 0 if head is embeddings else head.numel()
    return sum(p.numel() for p in model.parameters()) - embeddings.numel() - untied, head.numel()


def matmul_parameters(model: Any) -> int:
    """Parameters that enter a matmul for a token whose log-prob is taken: the body and the head."""
    return sum(parameter_split(model))


def model_parameters(model_path: str) -> tuple[int, int]:
    """:func:`parameter_split` of the causal LM at ``model_path``, from its config alone (built on no device)."""
    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        return parameter_split(AutoModelForCausalLM.from_config(config))


def update_flops(parameters: tuple[int, int], figures: dict[str, float], lora: bool = False) -> float:
    """Model FLOPs of one policy update from the learner's counts: ``6·N·tokens`` for the trained
    forward+backward, ``2·N·tokens`` for every forward-only pass (π_old, the KL reference).

    Tokens are real (unpadded) ones: the body's are the training forwards' attended tokens, the head's their
    action tokens; a forward-only kind covers the share of them its fed tokens are of the training forwards'.
    A LoRA policy's base weights are frozen: its backward computes activation gradients only, ``4·N`` in all
    (the adapter's own FLOPs, under 1% of N at rank 16, are left out).
    """
    body, head = parameters
    trained = figures.get("policy/train_tokens", 0.0)
    if not trained:
        return 0.0
    real = body * figures["policy/attended_tokens"] + head * figures["policy/action_tokens"]
    return sum(factor * real * figures.get(f"policy/{kind}_tokens", 0.0) / trained
               for kind, factor in (("train", 4 if lora else 6), ("old_logp", 2), ("reference", 2)))


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``: this process's resident set, and its peak) in
    bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_memory(cuda: bool) -> int:
    """Start a new peak window; the memory in use now (CUDA: allocated bytes; CPU: the resident set)."""
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set (Linux)
    return status_bytes("VmRSS")
