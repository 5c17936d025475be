"""``bridge-ray config``: validate a config and print it fully resolved."""

from __future__ import annotations

import argparse

from bridge_ray.cli import add_config_arguments, config_from_args
from bridge_ray.config import dump_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    print(dump_config(config_from_args(args)), end="")
    return 0
