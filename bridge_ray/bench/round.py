"""``bridge-ray bench round``: one config's BRIDGE rounds timed phase by phase, once per variant of one key.

``--compare engine.backend=hf,vllm`` (the default) compares sampler backends; ``--compare
rollout.max_staleness=0,1`` compares synchronous with asynchronous rounds. Each variant starts its own
graph; ``--untimed`` rounds run first untimed (in async mode the first round has nothing to overlap). Every
variant starts from the same policy: the config's warm-up (trained once, or found in the cache) when it has one.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

from bridge_ray.cli import add_deprecated_flag, add_out_argument, add_overrides_argument
from bridge_ray.cli_types import name_list, non_negative_int, positive_int
from bridge_ray.config import load_config
from bridge_ray.errors import InputError, InputErrors, Problems
from bridge_ray.reporting.figures import plot_round, write_figures, wrote
from bridge_ray.reporting.tables import markdown_table
from bridge_ray.sweep.timing import PHASES, starting_policy, time_rounds, timing_overrides
from bridge_ray.train.preflight import preflight


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="jobs/configs/local_cpu.yaml", metavar="FILE")
    parser.add_argument("--compare", default="engine.backend=hf,vllm", metavar="KEY=V1,V2",
                        help="a config key and the comma-separated values to time")
    parser.add_argument("--rounds", type=positive_int, default=1, help="timed rounds per value")
    parser.add_argument("--untimed", type=non_negative_int, default=0, metavar="N",
                        help="untimed rounds per value before the timed ones")
    add_deprecated_flag(parser, "--warmup", "--untimed", type=non_negative_int)
    add_out_argument(parser, "file", "also write the seconds per round and phase of each value, and the ratio, as JSON",
                     metavar="FILE.json")
    add_overrides_argument(parser)


def run(args: argparse.Namespace) -> int:
    base = load_config(args.config, args.overrides)  # its own errors name the file or override, not --compare
    variants = compared_configs(args)
    common = [*args.overrides, *starting_policy(base)]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-round-") as tmp:
        for variant in variants:
            config = load_config(args.config, [*common, variant, *timing_overrides(f"{tmp}/{len(results)}")])
            results[variant] = time_rounds(config, args.rounds, args.untimed)[0]
    names = list(results)
    print(f"seconds per round ({args.untimed} untimed + {args.rounds} timed round(s) each, config {args.config})")
    print_phases(results)
    figures: dict[str, object] = {"config": args.config, "overrides": args.overrides, "warmup": args.untimed,
                                  "rounds": args.rounds, "seconds": results}
    if len(names) == 2:
        a, b = names
        figures["ratio"] = results[b]["round"] / results[a]["round"]
        print(f"round time {b} / {a}: {figures['ratio']:.2f}")
    if args.out:
        write_round_figures(args.out, figures, results)
    return 0


def compared_configs(args: argparse.Namespace) -> list[str]:
    """The ``KEY=VALUE`` override of each ``--compare`` value, each loaded and checked as ``train`` checks a run,
    so that a misspelt key, a bad value or an input it cannot use is refused before the warm-up trains and Ray
    starts (every problem at once)."""
    key, sep, values = args.compare.partition("=")
    if not sep or not key.strip() or not values:
        raise InputError(f"--compare {args.compare!r}: expected KEY=V1,V2 (a config key and its values)")
    try:
        variants = [f"{key}={value}" for value in name_list()(values)]
    except argparse.ArgumentTypeError as e:
        raise InputError(f"--compare {args.compare!r}: {e}") from None
    problems = Problems()
    for variant in variants:
        with problems.check():
            try:
                preflight(load_config(args.config, [*args.overrides, variant]))
            except InputError as e:
                raise InputErrors([f"--compare {variant}: {p}" for p in e.problems]) from None
    problems.raise_any()
    return variants


def print_phases(results: dict[str, dict[str, float]]) -> None:
    """The seconds of each phase, the round and the graph's start-up, one column per variant."""
    names = list(results)
    rows = [[phase, *(f"{results[n][phase]:.1f}" for n in names)] for phase in (*PHASES, "round", "startup")]
    print("\n".join(markdown_table(["phase", *names], rows, "l" + "r" * len(names))))


def write_round_figures(out: str, figures: dict[str, Any], results: dict[str, dict[str, float]]) -> None:
    """``--out``: the figures as JSON and the variants' rounds as stacked phase bars beside it (PNG)."""
    wrote(write_figures(out, figures, lambda _, png: plot_round(results, png, PHASES)))
