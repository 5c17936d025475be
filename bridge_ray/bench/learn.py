"""``bridge-ray bench learn``: does RL over the warm-up learn, and does BRIDGE beat a fixed retriever?

The command line of a sweep (:mod:`bridge_ray.sweep`): every (preset, seed) run starts from the same warm-up
checkpoint (with ``--warmup-per-seed``, from its seed's own warm-up) and trains the same number of rounds on the
train split through the real actor graph. Its checkpoints, every ``--eval-every`` rounds, are evaluated greedily on
two sets never trained on: the world's held-out test split (``world``, or ``gap`` on the gap world; ``--split dev``
takes the dev split instead, for choosing settings without looking at test) and an out-of-distribution world
(``ood``). Round 0, the warm-up policy, is evaluated once per warm-up, and so is the ``oracle`` arm, the warm-up
policy shown the gold passages (:mod:`bridge_ray.sweep.evaluations`).

Runs of one seed share the question order and the sampler seeds of every round, so presets pair up question by
question: each preset's difference from ``fixed`` (or ``--baseline``), and BRIDGE's from every other preset, per
seed and over the seeds (:mod:`bridge_ray.sweep.paired`).

A preset is a schedule's config file (``jobs/configs/presets/<setting>/<name>.yaml``, paper Table 3 and Fig. 2a),
loaded on top of ``--config`` in place of the preset's own ``base:`` (``jobs/configs/local_cpu_gap.yaml`` runs every
schedule on the gap world's settings). A staged preset (``stages:``, e.g. RAG-then-RL) runs its stages one after
the other, the first for ``--rounds`` and the others scaled in proportion to the file's rounds
(:mod:`bridge_ray.sweep.runs`). Beside the paper's schedules, ``bridge_paper`` is BRIDGE with the paper's retriever
loss and ``ablate_<departure>`` BRIDGE with one departure of the gap world's settings switched off, so that BRIDGE
minus each is what that departure changes.

A bench run that stopped can be started again with the same arguments: finished runs and evaluations are kept, an
unfinished run resumes from its last checkpoint. Writes ``DIR/results.json``, ``DIR/results.md`` and
``DIR/curves.png`` (:mod:`bridge_ray.sweep.results`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge_ray.cli import add_out_argument, add_overrides_argument
from bridge_ray.cli_types import name_list, non_negative_int, positive_int, seed_list
from bridge_ray.errors import InputError
from bridge_ray.reporting.figures import provenance
from bridge_ray.sweep.grid import Sweep
from bridge_ray.sweep.paired import BASELINE
from bridge_ray.sweep.results import results_markdown, write_results
from bridge_ray.sweep.runs import run_sweep

CONFIGS = {"default": "jobs/configs/local_cpu.yaml", "gap": "jobs/configs/local_cpu_gap.yaml"}  # --config by --world
PRESET_DIR = "jobs/configs/presets/local_cpu"  # one file per schedule: fixed.yaml, bridge.yaml, rag_then_rl.yaml, ...
QUICK = {"seeds": [0], "rounds": 4, "eval_every": 4, "eval_questions": 200}
# The departures of jobs/configs/local_cpu_gap.yaml from the paper, each switched off by PRESET_DIR/ablate_<name>.yaml
ABLATIONS = ("trust_region", "candidates", "retriever_step", "rollouts", "dynamic_sampling", "policy_lora",
             "policy_kl", "old_logp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="the base of every preset (in place of its own base:), of the warm-up and the evaluations "
                        f"(default: {CONFIGS['gap']} with --world gap, else {CONFIGS['default']})")
    parser.add_argument("--world", choices=["default", "gap"],
                        help="data.world of every run and evaluation (default: the config's)")
    parser.add_argument("--presets", type=name_list(), default="fixed,bridge",
                        help="comma-separated schedules, each a file <preset-dir>/<name>.yaml: the paper's fixed, "
                        "bridge, decoupled_rl, decoupled_rag, rag_then_rl, rl_then_rag; bridge_paper (BRIDGE with the "
                        "paper's retriever loss); ablate_<departure>, BRIDGE with one departure from the paper "
                        f"switched off: {', '.join(ABLATIONS)}")
    parser.add_argument("--preset-dir", default=PRESET_DIR, metavar="DIR", help="where the preset files are")
    parser.add_argument("--seeds", type=seed_list, default="0,1,2", help="comma-separated run seeds")
    parser.add_argument("--rounds", type=positive_int, default=12, help="RL rounds per run")
    parser.add_argument("--eval-every", type=positive_int, default=4, help="evaluate every N rounds (and the last)")
    parser.add_argument("--eval-questions", type=positive_int, default=200, help="questions of each evaluation set")
    parser.add_argument("--baseline", default=BASELINE, metavar="PRESET",
                        help="the preset every other one is paired against (default: the fixed retriever)")
    parser.add_argument("--split", choices=["test", "dev"], default="test",
                        help="the held-out split every evaluation asks (dev: for choosing settings; test: to report)")
    parser.add_argument("--ood-seed", type=non_negative_int, default=1, help="seed of the out-of-distribution world")
    parser.add_argument("--warmup-per-seed", action="store_true",
                        help="each seed starts from its own warm-up (warmup.seed = the seed) instead of the config's")
    parser.add_argument("--quick", action="store_true",
                        help="seed 0; 4 rounds; evaluate at the end on 200 questions per set (fixed,bridge on the gap "
                             "world: about 50 min on 2 cores, 35 with round 0 kept in the cache)")
    add_out_argument(parser, "folder", "the runs, their evaluations and the figures; a bench stopped there resumes",
                     required=True, resumable=True)
    add_overrides_argument(parser, "applied to every run")


def base_config(args: argparse.Namespace) -> str:
    """``--config``, else the world's own settings: ``--world gap`` is the gap world as ``make demo`` trains it."""
    return args.config or CONFIGS[args.world or "default"]


def preset_files(args: argparse.Namespace) -> dict[str, Path]:
    """Each ``--presets`` name's file under ``--preset-dir``; a name without a file, or a ``--baseline`` that is
    not a preset, is refused."""
    presets = {name: Path(args.preset_dir) / f"{name}.yaml" for name in args.presets}
    if missing := [name for name, path in presets.items() if not path.is_file()]:
        known = sorted(p.stem for p in Path(args.preset_dir).glob("*.yaml"))
        raise InputError(f"--presets: no file for {', '.join(missing)} in {args.preset_dir}; known: {', '.join(known)}")
    if args.baseline not in presets and args.baseline != BASELINE:
        raise InputError(f"--baseline {args.baseline}: not one of --presets ({','.join(args.presets)})")
    return presets


def sweep_of(args: argparse.Namespace, presets: dict[str, Path]) -> Sweep:
    """The sweep the flags ask for (``--config`` already resolved by :func:`base_config`)."""
    return Sweep(
        config=args.config, presets=presets, seeds=args.seeds, rounds=args.rounds, eval_every=args.eval_every,
        eval_questions=args.eval_questions, out=Path(args.out),
        overrides=[*args.overrides, *([f"data.world={args.world}"] if args.world else [])], split=args.split,
        ood_seed=args.ood_seed, warmup_per_seed=args.warmup_per_seed, baseline=args.baseline,
        command=provenance("learn")["command"],
    )


def run(args: argparse.Namespace) -> int:
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    args.config = base_config(args)
    sweep = sweep_of(args, preset_files(args))
    results = run_sweep(sweep)
    written = write_results(sweep.out, results)
    print(results_markdown(results), flush=True)
    print(f"\nwrote {', '.join(map(str, written))} ({results['seconds']:.0f} s)")
    return 0
