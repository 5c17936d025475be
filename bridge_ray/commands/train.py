"""``bridge-ray train``: parse the flags and the config, then run the job (:mod:`bridge_ray.train.job`) on a Ray
cluster (a local one by default)."""

from __future__ import annotations

import argparse

from bridge_ray.cli import add_config_arguments, config_from_args
from bridge_ray.train.job import run_job
from bridge_ray.train.run_folder import JobFlags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")
    start.add_argument(
        "--auto-resume", action="store_true",
        help="continue from the last complete checkpoint if there is one, else start (for resubmitted jobs)",
    )
    start.add_argument(
        "--overwrite", action="store_true",
        help="replace the run in run.output_dir: remove its checkpoints, logs, evaluations and config.yaml first "
        "(other files stay)",
    )
    parser.add_argument(
        "--dry-run", action="store_true",
        help="check keys, paths and what the graph needs in CPUs and GPUs per role against the Ray cluster (this "
        "machine when the inputs fail and no cluster is named); every problem at once, exit 2; load no model",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    flags = JobFlags(resume=args.resume, auto_resume=args.auto_resume, overwrite=args.overwrite, dry_run=args.dry_run)
    run_job(config_from_args(args), flags)
    return 0
