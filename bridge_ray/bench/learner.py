"""``bridge-ray bench learner``: throughput, MFU and peak memory of the policy update on one device.

The model is built from its architecture config (``--model``: a name under ``jobs/configs/models/`` or a JSON
file; random weights, no download). One step is the learner's: ``sequence_log_probs`` (every token after the
first is an action token, so the LM head scores them all), the GRPO ``policy_objective``, backward, gradient
clipping, AdamW. The trajectories are random token ids, ``--rows`` x ``--length`` per micro-batch; a variant
that runs out of device memory is retried with half the rows, down to one.

Variants: ``full`` (full fine-tune), ``full_ckpt`` (with gradient checkpointing), ``lora`` and ``lora_ckpt``
(the learner's default LoRA: rank 16 on every projection). AdamW updates the weights in their own dtype
(bf16 on CUDA): DeepSpeed's bf16 mode would add fp32 master weights and moments, 12 bytes per trained
parameter, which ``deepspeed_extra_bytes`` states without measuring.

MFU = model FLOPs per second / ``peak_tflops``. Model FLOPs per token: 6N for a full step (forward 2N,
backward 4N), 4N with LoRA (no weight gradients of the frozen base); N counts the parameters that enter a
matmul (the input embedding lookup excluded, a tied LM head once); attention scores and recomputation under
checkpointing are not counted, as usual. ``peak_tflops`` defaults to the card's dense bf16 rate from its
data sheet when the card is known (H100/H200 SXM: 989), else to the measured matmul rate; the matmul rate
(a square bf16 product on CUDA, fp32 on CPU) is reported beside it, with ``mfu_vs_matmul``. Peak memory is
``torch.cuda.max_memory_allocated`` per variant (weights included); it is not measured on CPU.

``--compile`` compiles each decoder layer (torch.compile), which the learner does not do: it shows what fusing
the eager elementwise work (RMSNorm, SwiGLU, rotary embeddings, casts; about half of an eager step on an H100,
per ``--profile``) is worth. ``--profile`` prints the costliest operators of one more step per variant.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM

from bridge_ray.cli import add_deprecated_flag, add_out_argument, dtype_name
from bridge_ray.cli_types import name_list, non_negative_int, positive_float, positive_int
from bridge_ray.config import GRPOConfig
from bridge_ray.errors import InputError
from bridge_ray.policy_learner.batch import PolicyBatch
from bridge_ray.policy_learner.objective import causal_lm, policy_objective, sequence_log_probs
from bridge_ray.reporting.figures import write_figures, wrote
from bridge_ray.reporting.measures import matmul_parameters, matmul_tflops, synchronize

VARIANTS = ("full", "full_ckpt", "lora", "lora_ckpt")
MODELS = Path(__file__).resolve().parents[2] / "jobs" / "configs" / "models"
# Dense bf16 tensor-core rates from NVIDIA's data sheets, TFLOP/s (H100/H200 SXM; sparsity doubles these).
DATASHEET_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="qwen2.5-3b",
                        help=f"architecture: a name in {MODELS.relative_to(MODELS.parents[2])} or a config JSON file")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when available)")
    parser.add_argument("--dtype", type=dtype_name, choices=("auto", "bfloat16", "float32"), default="auto",
                        help="auto: bfloat16 on CUDA, else float32")
    parser.add_argument("--rows", type=positive_int, default=4, help="trajectories per micro-batch (halved on OOM)")
    parser.add_argument("--length", type=positive_int, default=2048, help="tokens per trajectory")
    parser.add_argument("--steps", type=positive_int, default=3, help="timed steps per variant")
    parser.add_argument("--untimed", type=non_negative_int, default=1, metavar="N",
                        help="untimed steps per variant before the timed ones")
    add_deprecated_flag(parser, "--warmup", "--untimed", type=non_negative_int)
    parser.add_argument("--variants", type=name_list(VARIANTS), default=",".join(VARIANTS),
                        help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--peak-tflops", type=positive_float, default=None,
                        help="the MFU denominator; default: the card's data-sheet bf16 rate, else the measured matmul")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each decoder layer (not the learner's path: what fusing the elementwise "
                             "work of norms, activations and rotary embeddings would give)")
    parser.add_argument("--profile", action="store_true",
                        help="after each variant's timed steps, profile one more and print its costliest operators")
    add_out_argument(parser, "file", "figures as JSON", required=True, metavar="FILE.json")


def run(args: argparse.Namespace) -> int:
    variants = [v for v in VARIANTS if v in args.variants]  # LoRA last: it wraps the model in place
    if args.length < 2:
        raise InputError(f"--length {args.length}: a trajectory needs at least 2 tokens (a next-token loss)")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(args.dtype) or (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    config = architecture_config(args.model)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    matmul = matmul_tflops(device, dtype)
    peak, peak_source = peak_rate(card, matmul, args.peak_tflops)
    figures: dict[str, Any] = {
        "model": args.model, "device": card, "dtype": str(dtype).removeprefix("torch."), "length": args.length,
        "matmul_tflops": matmul, "peak_tflops": peak, "peak_source": peak_source, "torch": torch.__version__,
    }
    print(f"{card}: matmul {matmul:.1f} TFLOP/s; MFU against {peak:.1f} TFLOP/s ({peak_source})", flush=True)
    model = build_model(config, device, dtype)
    if args.compile:
        for layer in model.model.layers:
            layer.compile()
    figures["compiled_layers"] = args.compile
    figures["parameters"] = float(sum(p.numel() for p in model.parameters()))
    figures["matmul_parameters"] = float(matmul_parameters(model))
    for variant in variants:
        if variant.startswith("lora") and not hasattr(model, "peft_config"):
            model = with_lora(model, dtype)
        f = figures[variant] = measure(model, variant, args.rows, args.length, args.steps, args.untimed, device,
                                       args.profile)
        if "tokens_per_s" in f:
            f["mfu"] = f["model_tflops"] / peak
            f["mfu_vs_matmul"] = f["model_tflops"] / matmul
            peak_gib = "n/a" if f["peak_bytes"] is None else f"{f['peak_bytes'] / 2**30:.1f} GiB"
            print(f"{variant:10s} {f['rows']}x{args.length}: {f['tokens_per_s']:10.0f} tokens/s, "
                  f"{f['seconds_per_step']:.3f} s/step, {f['model_tflops']:.1f} TFLOP/s, MFU {f['mfu']:.1%} "
                  f"(vs matmul {f['mfu_vs_matmul']:.1%}), peak {peak_gib}", flush=True)
        else:
            print(f"{variant:10s} out of memory even at 1 row", flush=True)
    wrote(write_figures(args.out, figures))
    return 0


def architecture_config(name: str):
    """The transformers config of ``name``: a file in :data:`MODELS` (``<name>.json``) or a JSON path."""
    path = Path(name) if name.endswith(".json") else MODELS / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in MODELS.glob("*.json"))
        raise InputError(f"--model {name}: no architecture config {path}; known: {', '.join(known)}, or a .json path")
    fields = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(**fields)


def build_model(config: Any, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Random weights, initialised on ``device`` directly (a 7B model's CPU init alone takes minutes)."""
    torch.manual_seed(0)
    with device:
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def with_lora(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The policy learner's default LoRA (``learner.lora``: rank 16, alpha 16, every projection), in ``dtype``.

    peft makes the factors fp32 (and every adapted layer then casts its input to fp32); DeepSpeed's bf16 mode,
    which the learner runs, casts the whole module to bf16, so the bench does too.
    """
    lora = LoraConfig(r=16, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    return get_peft_model(model, lora).to(dtype)


def synthetic_batch(rows: int, length: int, vocab: int, device: torch.device):
    """``rows`` full-length trajectories whose every token after the first is an action token."""
    g = torch.Generator().manual_seed(1)
    ones = torch.ones(rows, length, dtype=torch.long)
    action = ones.clone()
    action[:, 0] = 0
    batch = PolicyBatch(
        input_ids=torch.randint(0, vocab, (rows, length), generator=g), attention_mask=ones, action_mask=action,
        old_logp=torch.full((rows, length), -12.0), turn_ids=torch.where(action.bool(), 0, -1),
        advantages=torch.randn(rows, generator=g), question_index=torch.arange(rows),
    )
    return batch.with_token_weights("token-mean").to(device)


def measure(model: torch.nn.Module, variant: str, rows: int, length: int, steps: int, warmup: int,
            device: torch.device, profile: bool = False) -> dict[str, Any]:
    """Seconds per step and peak memory of ``variant``, with ``rows`` halved until a step fits."""
    while True:
        try:
            return _measure(model, variant, rows, length, steps, warmup, device, profile)
        except torch.OutOfMemoryError:
            if rows == 1:
                return {"rows": 0, "oom": True}
        _release(device)  # out of the except block: its traceback no longer holds the step's tensors
        rows //= 2


def _measure(model: torch.nn.Module, variant: str, rows: int, length: int, steps: int, warmup: int,
             device: torch.device, profile: bool) -> dict[str, Any]:
    grpo = GRPOConfig(kl_coef=0.0, old_logp="sampler")
    lm = causal_lm(model)
    if variant.endswith("_ckpt"):
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        lm.gradient_checkpointing_disable()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0, fused=device.type == "cuda")
    batch = synthetic_batch(rows, length, lm.config.vocab_size, device)
    _release(device)

    def step() -> None:
        logp, _ = sequence_log_probs(model, batch)
        loss, _ = policy_objective(logp, batch, grpo)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        times = []
        for i in range(warmup + steps):
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        if profile:
            print_profile(step, device, variant)
    finally:  # free the gradients and moments now, also while an OOM's traceback holds this frame
        optimizer.zero_grad(set_to_none=True)
        optimizer.state.clear()
    seconds = sum(times) / len(times)
    tokens = rows * length
    flops_per_token = (4 if variant.startswith("lora") else 6) * matmul_parameters(lm)
    trained = sum(p.numel() for p in params)
    return {
        "rows": rows, "tokens_per_step": tokens, "seconds_per_step": seconds, "tokens_per_s": tokens / seconds,
        "flops_per_token": float(flops_per_token), "model_tflops": flops_per_token * tokens / seconds / 1e12,
        "peak_bytes": peak,
        "trained_parameters": float(trained), "deepspeed_extra_bytes": 12.0 * trained,
    }


def print_profile(step: Any, device: torch.device, variant: str, rows: int = 25) -> None:
    """The operators of one ``step`` that took the most device (else CPU) time, with their share of it."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        synchronize(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=rows)
    print(f"--- profile of one {variant} step ---\n{table}", flush=True)


def peak_rate(card: str, matmul: float, given: float | None) -> tuple[float, str]:
    if given is not None:
        return given, "--peak-tflops"
    for name, rate in DATASHEET_BF16_TFLOPS.items():
        if name in card:
            return rate, f"{name} data sheet, dense bf16"
    return matmul, "measured matmul"


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
