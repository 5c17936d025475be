"""Rounds of a :class:`~bridge_ray.train.run.Run` timed phase by phase: what ``bench round`` compares across the
values of one key and ``bench speed`` across two sets of settings. Every graph timed starts from the same policy
and writes nowhere it would be read from."""

from __future__ import annotations

import time
from collections.abc import Callable

from bridge_ray.config import Config
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.train.run import Run
from bridge_ray.warmup import trainer as warmup

PHASES = ("rollout", "reward", "score", "retriever_update", "policy_update", "sync")


def starting_policy(config: Config) -> list[str]:
    """The overrides that start a timed graph from ``config``'s policy after its warm-up (trained here once, or
    found in the cache): a graph does not warm up by itself (``train`` does, before starting it). Given to every
    variant, so that variants that would warm up differently (another dtype) still sample the same rollouts."""
    policy = str(warmup.warmed_up_policy(config)) if config.warmup.enabled else resolve_model_path(config.policy.model)
    return ["warmup.enabled=false", f"policy.model={policy}"]


def timing_overrides(output_dir: str) -> list[str]:
    """What every timed graph sets: its own folder, no evaluations, no W&B, no checkpoints (``run.rounds`` beyond
    the rounds timed: the run's last round would checkpoint; :func:`timed_rounds` gives the real N instead)."""
    return [f"run.output_dir={output_dir}", "eval.before_training=false", "eval.after_training=false",
            "eval.every_rounds=0", "telemetry.wandb_mode=disabled", "checkpoint.every_rounds=1000000",
            "run.rounds=1000000"]


def time_rounds(config: Config, rounds: int, untimed: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Start ``config``'s graph (a :class:`Run` without ``train``'s checks, evaluations and checkpoints), run
    ``untimed`` rounds then ``rounds`` timed ones, and shut it down.

    Returns the mean seconds per phase and per round (plus the graph's ``startup``, Ray's own start aside), and
    each timed round's figures as the coordinator reported them.
    """
    with Run(config) as run:
        run.connect()
        started = time.perf_counter()
        coordinator = run.start()  # the graph is up: start-up is not part of a round
        startup = time.perf_counter() - started
        means, reported = timed_rounds(coordinator.run_round, rounds, untimed)
    return {**means, "startup": startup}, reported


def timed_rounds(
    run_round: Callable[[int], dict[str, float]], rounds: int, untimed: int
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """``untimed`` then ``rounds`` timed calls of ``run_round(total)``, ``total`` being the rounds run in
    all (so the coordinator's ``[round r/N ETA]`` line counts to the bench's end, not to ``run.rounds``).

    Returns the mean seconds per phase and per round, and each timed round's figures.
    """
    total = untimed + rounds
    for _ in range(untimed):
        run_round(total)
    totals = dict.fromkeys((*PHASES, "round"), 0.0)
    reported = []
    for _ in range(rounds):
        start = time.perf_counter()
        figures = run_round(total)
        totals["round"] += time.perf_counter() - start
        for phase in PHASES:
            totals[phase] += figures.get(f"time/{phase}", 0.0)
        reported.append(figures)
    return {k: v / rounds for k, v in totals.items()}, reported
