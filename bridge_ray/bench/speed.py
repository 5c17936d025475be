"""``bridge-ray bench speed``: a round with the current defaults against one with the plain settings they replaced.

Both graphs run in this process tree, one after the other, on the same questions and sampler seeds (the same
config and ``run.seed``) from the same warm-up policy. ``REFERENCE`` is the plain baseline: fp32 learner and
sampler, the HF sampler encoding each turn's prompt whole and serving a LoRA adapter through peft, a separate π_old
forward before every mini-batch, micro-batches cut in row order; and,
unless ``--reference-policy config``, a full fine-tune of the policy (``FULL_FINE_TUNE``: lr 1e-5 with a KL
reference model and the learner's own π_old). A config whose policy only fits as LoRA keeps its own with
``config``. The policy update's FLOP rate is set against the matmul rate measured on the learner's threads
(``update_mfu``), so the figure is comparable across machines.
"""
from __future__ import annotations

import argparse
import tempfile
from typing import Any

from bridge_ray.bench.round import print_phases, write_round_figures
from bridge_ray.cli import add_deprecated_flag, add_out_argument, add_overrides_argument
from bridge_ray.cli_types import non_negative_int, positive_int
from bridge_ray.config import load_config
from bridge_ray.engines.precision import resolve_precision
from bridge_ray.reporting.measures import matmul_gflops, model_parameters, update_flops
from bridge_ray.sweep.timing import starting_policy, time_rounds, timing_overrides

REFERENCE = (
    "learner.dtype=float32",
    "policy.dtype=float32",
    "engine.backend=hf",
    "engine.hf.prefix_cache=false",
    "engine.hf.merge_adapter=false",
    "learner.reuse_old_logp=false",
    "learner.length_buckets=false",
)
FULL_FINE_TUNE = (
    "learner.lora.enabled=false",
    "optim.lr=1.0e-5",
    "algorithm.grpo.kl_coef=1.0e-4",
    "algorithm.grpo.old_logp=learner",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="jobs/configs/local_cpu.yaml", metavar="FILE")
    parser.add_argument("--rounds", type=positive_int, default=1, help="timed rounds per side")
    parser.add_argument("--untimed", type=non_negative_int, default=0, metavar="N",
                        help="untimed rounds per side before the timed ones")
    add_deprecated_flag(parser, "--warmup", "--untimed", type=non_negative_int)
    parser.add_argument("--reference-policy", choices=("full", "config"), default="full",
                        help="full: the reference side fine-tunes the whole policy (KL to a reference model, the "
                             "learner's own pi_old); config: it trains the config's own policy")
    add_out_argument(parser, "file", "also write the figures as JSON and the phases as PNG", metavar="FILE.json")
    add_overrides_argument(parser, "applied to both sides")


def run(args: argparse.Namespace) -> int:
    common = [*args.overrides, *starting_policy(load_config(args.config, args.overrides))]
    reference = reference_settings(args.reference_policy)
    sides: dict[str, dict[str, float]] = {}
    reported: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-speed-") as tmp:
        for side, extra in (("reference", reference), ("defaults", ())):
            config = load_config(args.config, [*common, *extra, *timing_overrides(f"{tmp}/{side}")])
            print(f"== {side}: {' '.join(extra) or 'the config as it is'}", flush=True)
            sides[side], reported[side] = time_rounds(config, args.rounds, args.untimed)
    threads = config.learner_threads()
    dtype = resolve_precision(config.learner.dtype, "learner.dtype", "cpu").compute
    peak = matmul_gflops(dtype, threads)
    update_s = sum(r["time/policy_update"] for r in reported["defaults"])
    parameters = model_parameters(config.policy.model)
    flops = sum(update_flops(parameters, r, config.learner.lora.enabled) for r in reported["defaults"])
    figures: dict[str, Any] = {
        "config": args.config, "overrides": args.overrides, "reference_settings": list(reference),
        "rounds": args.rounds, "warmup": args.untimed, "policy": config.policy.model,
        "reference_round_s": sides["reference"]["round"], "round_s": sides["defaults"]["round"],
        "ratio": sides["defaults"]["round"] / sides["reference"]["round"],
        "phases": sides, "update_gflops": flops / update_s / 1e9, "peak_gflops": peak,
        "peak_dtype": str(dtype).removeprefix("torch."), "learner_threads": threads,
    }
    figures["update_mfu"] = figures["update_gflops"] / peak
    print_phases(sides)
    print(f"round time defaults / reference: {figures['ratio']:.2f}; policy update {figures['update_gflops']:.1f} "
          f"GFLOP/s of a measured {peak:.1f} ({figures['peak_dtype']}, {threads} threads): "
          f"MFU {figures['update_mfu']:.2f}")
    if args.out:
        write_round_figures(args.out, figures, sides)
    return 0


def reference_settings(policy: str) -> tuple[str, ...]:
    """The reference side's overrides: ``REFERENCE``, plus ``FULL_FINE_TUNE`` for ``policy`` ``full``."""
    return (*REFERENCE, *FULL_FINE_TUNE) if policy == "full" else REFERENCE
