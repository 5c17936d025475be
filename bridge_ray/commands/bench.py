"""``bridge-ray bench <name>``: benchmark scripts that print figures (ratios measured within one run)."""

from __future__ import annotations

import argparse

from bridge_ray.cli import Command, add_subcommands

# name -> module of bridge_ray.bench defining add_arguments(parser) and run(args) -> int, and its help
BENCHMARKS: dict[str, Command] = {
    "retrieval": Command("bridge_ray.bench.retrieval",
        "retrieval figures: frozen-encoder recall on the default world, encoding and sharded search throughput"),
    "agent": Command("bridge_ray.bench.agent",
        "agent rollouts/s and tokens/s on HF vs vLLM, and the answer-scorer speed-up (shared prefix vs naive)"),
    "round": Command("bridge_ray.bench.round",
        "per-phase time breakdown of BRIDGE rounds for each value of one key (HF vs vLLM, sync vs async)"),
    "learn": Command("bridge_ray.bench.learn",
        "learning curves of RL over the warm-up: presets x seeds, held-out and out-of-distribution EM"),
    "learner": Command("bridge_ray.bench.learner",
        "policy-update tokens/s, MFU and peak memory of a model built from its config (full, checkpointing, LoRA)"),
    "trl": Command("bridge_ray.bench.trl",
        "one GRPO step through TRL's GRPOTrainer and through our policy learner: seconds each and the speedup"),
    "estimators": Command("bridge_ray.bench.estimators",
        "Fig. 4a-b: cosine and relative error of the BRIDGE and Drop theta-gradients against two-state, over gamma"),
    "retriever-update": Command("bridge_ray.bench.retriever_update",
        "Fig. 2b: peak memory and time per retriever (eta) update, BRIDGE vs two-state (and Drop)"),
    "landscape": Command("bridge_ray.bench.landscape",
        "Fig. 3: filter-normalised random-direction landscapes of L_RAG and the RL loss over (theta, eta) and "
        "theta"),
    "speed": Command("bridge_ray.bench.speed",
        "one round with the current defaults against one with the plain settings they replaced (fp32, no prefix "
        "cache, a separate pi_old pass, a full fine-tune): time, phases, MFU"),
    "world": Command("bridge_ray.bench.world",
        "calibration gates of a bundled world: frozen recall at the shown and candidate depths, frozen vs oracle "
        "EM"),
    "paired": Command("bridge_ray.bench.paired",
        "treated − baseline EM and recall on the same questions, with a 95% interval (over seeds and questions "
        "from 3 seeds on), and each seed's own, from eval_*.json files"),
    "replay": Command("bridge_ray.bench.replay",
        "retriever steps compared on the same logged rollouts (policy fixed): held-out recall per round, paired"),
    "seeds": Command("bridge_ray.bench.seeds",
        "draw each seed's paired difference (treated - baseline) and the pooled one from bench learn results.json "
        "files"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_subcommands(parser, BENCHMARKS, "benchmark", "_bench")


def run(args: argparse.Namespace) -> int:
    return int(args._bench(args) or 0)

