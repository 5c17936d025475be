"""``bridge-ray bench landscape``: Fig. 3 — filter-normalised random-direction loss landscapes at two checkpoints.

Three surfaces ``f(α, β)`` per checkpoint, on :func:`bridge_ray.algo.landscape.loss_surface`'s grid:
(a) ``L_RAG(θ + α d_θ, η + β d_η)``, (b) ``L_RL(θ + α d_θ, η + β d_η)``, (c) ``L_RL(θ + α d_θ + β d_θ', η)``, on
one fixed batch of rollouts drawn by the initial policy and retriever, the same at both checkpoints so that the
panels compare (the objectives and the directions: :mod:`bridge_ray.probes.landscape`). Everything runs forward
only, on CPU; ``--points`` odd puts the checkpoint itself at the centre of every grid.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bridge_ray.algo.landscape import grid_axis
from bridge_ray.checkpoint import POLICY_DIR, checkpoint_root, find_checkpoint, retriever_adapter_dir
from bridge_ray.cli import add_config_arguments, add_out_argument, config_from_args
from bridge_ray.cli_types import non_negative_int, positive_float, positive_int
from bridge_ray.errors import InputError
from bridge_ray.probes.batch import RolloutBatch
from bridge_ray.probes.landscape import Objectives, load_encoder, load_policy, surfaces
from bridge_ray.reporting.figures import plot_landscape, write_figures, wrote


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--initial", metavar="CHECKPOINT",
                        help="initial checkpoint (its policy/ and retriever_adapter/); default: the policy the config "
                             "trains from (its warm-up when warmup.enabled) with the base retriever")
    parser.add_argument("--final", metavar="CHECKPOINT",
                        help="final checkpoint, or a directory of checkpoints (its latest); default: the latest "
                             "under the config's checkpoint root")
    parser.add_argument("--questions", type=positive_int, default=1, help="train questions in the batch")
    parser.add_argument("--first-question", type=non_negative_int, default=0,
                        help="index of the batch's first train question (a group whose rewards all agree has zero "
                             "advantages, hence a zero RL loss everywhere)")
    parser.add_argument("--points", type=positive_int, default=7,
                        help="grid points per axis (odd: the checkpoint is the centre)")
    parser.add_argument("--span", type=positive_float, default=1.0,
                        help="the grid covers [-span, span] along each direction (1: a step of each filter's norm)")
    add_out_argument(parser, "file", "grids and axes as JSON; a PNG of the contour plots is written beside it",
                     required=True, metavar="FILE.json")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    config = config_from_args(args)
    try:
        axis = grid_axis(args.span, args.points)
    except ValueError as exc:
        raise InputError(f"--points {args.points} / --span {args.span}: {exc}") from None
    if args.questions < 1 or args.first_question < 0:
        raise InputError(f"--questions {args.questions} / --first-question {args.first_question}: must be >= 1 / >= 0")
    if config.roles.torch_threads:
        torch.set_num_threads(config.roles.torch_threads)
    initial = _checkpoint(args.initial, "--initial") if args.initial else (None, None)
    final = _checkpoint(args.final or checkpoint_root(config), "--final")
    started = time.time()
    batch = RolloutBatch(config, args.questions, str(initial[0]) if initial[0] else None, initial[1],
                         first=args.first_question)
    if reason := batch.unusable():  # no L_RAG to draw, or an RL loss of 0 everywhere
        raise InputError(f"bench landscape: train questions {args.first_question} to "
                         f"{args.first_question + args.questions - 1}: {reason}; pick other questions with "
                         "--first-question, more with --questions, or a policy that searches (its warm-up, or the "
                         "few-shot prompt)")
    print(f"batch: {len(batch.trajectories)} trajectories, {len(batch.groups)} retrieval turns, mean reward "
          f"{batch.reward_mean:.3f} ({time.time() - started:.0f} s)", flush=True)
    objectives = None
    checkpoints = {}
    for label, (policy, adapter) in (("initial", (batch.policy, initial[1])), ("final", final)):
        model = load_policy(str(policy))
        objectives = objectives or Objectives(batch, model)  # ratios against the batch's own (initial) policy
        checkpoints[label] = {"policy": str(policy), "retriever_adapter": str(adapter) if adapter else None,
                              **surfaces(objectives, model, load_encoder(config, adapter), axis, label)}
        del model
    figures = {
        "axis": axis, "span": args.span, "points": args.points, "seed": config.run.seed,
        "batch": {"policy": batch.policy, "questions": len(batch.questions), "trajectories": len(batch.trajectories),
                  "retrieval_turns": len(batch.groups), "reward_mean": batch.reward_mean},
        "grids": "values[i][j] at alpha = axis[i] (theta direction d), beta = axis[j] (eta direction, or theta "
                 "direction d' for rl_theta)",
        "checkpoints": checkpoints, "seconds": round(time.time() - started, 1),
    }
    wrote(write_figures(out, figures, plot_landscape))
    return 0


def _checkpoint(path: str | Path, flag: str) -> tuple[Path, Path | None]:
    """The policy directory and retriever adapter (None: the run's retriever was fixed) of a checkpoint."""
    directory, _ = find_checkpoint(path, flag, model=POLICY_DIR)
    return directory / POLICY_DIR, retriever_adapter_dir(directory)


