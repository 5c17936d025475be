"""``bridge-ray bench round``: one config's BRIDGE rounds timed phase by phase, once per sampler backend."""

from __future__ import annotations

import argparse
import tempfile
import time

HELP = "per-phase time breakdown of BRIDGE rounds, and the round time with HF vs vLLM samplers (one run)"
PHASES = ("rollout", "reward", "score", "retriever_update", "policy_update", "sync")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="jobs/configs/local_cpu.yaml", metavar="FILE")
    parser.add_argument("--backends", default="hf,vllm", help="comma-separated engine.backend values to compare")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds per backend")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value")


def run(args: argparse.Namespace) -> int:
    import ray

    from bridge_ray.actors.coordinator import CoordinatorActor
    from bridge_ray.commands.train import connect
    from bridge_ray.config import load_config

    connect(None)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-round-") as tmp:
        for backend in args.backends.split(","):
            config = load_config(args.config, [
                *args.overrides, f"engine.backend={backend}", f"run.output_dir={tmp}/{backend}",
                "eval.before_training=false", "eval.after_training=false", "eval.every_rounds=0",
                "telemetry.wandb_mode=disabled", "checkpoint.every_rounds=1000000", "run.rounds=1000000",
            ])
            coordinator = CoordinatorActor.remote(config)
            try:
                ray.get(coordinator.state.remote())  # the graph is up: start-up is not part of a round
                totals = dict.fromkeys((*PHASES, "round"), 0.0)
                for _ in range(args.rounds):
                    start = time.perf_counter()
                    figures = ray.get(coordinator.run_round.remote())
                    totals["round"] += time.perf_counter() - start
                    for phase in PHASES:
                        totals[phase] += figures.get(f"time/{phase}", 0.0)
            finally:
                ray.get(coordinator.shutdown.remote())
            results[backend] = {k: v / args.rounds for k, v in totals.items()}
    names = list(results)
    print(f"seconds per round ({args.rounds} round(s) each, config {args.config})")
    print("| phase | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for phase in (*PHASES, "round"):
        print(f"| {phase} | " + " | ".join(f"{results[n][phase]:.1f}" for n in names) + " |")
    if len(names) == 2:
        a, b = names
        print(f"round time {a} / {b}: {results[a]['round'] / results[b]['round']:.2f}")
    return 0
