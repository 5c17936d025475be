"""``bridge-ray make-world``: write the synthetic knowledge world (corpus + QA splits) to a directory.

``--out`` must be new or empty: a world (or anything else) already there is replaced only under ``--overwrite``.
"""

from __future__ import annotations

import argparse

from bridge_ray.cli import add_out_argument
from bridge_ray.coordinator.inputs import WORLD_KINDS
from bridge_ray.data.world import PHRASINGS, WORLD_INFO, write_world


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_out_argument(parser, "folder", "where the world goes: new or empty (created if missing)", required=True,
                     what="a world", marker=WORLD_INFO,
                     remedy="choose another --out, or pass --overwrite to write over it",
                     overwrite="write over a world already in --out (other files there are kept)")
    parser.add_argument(
        "--world", choices=["default", "gap"], default="default", help="which bundled world (data.world)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the world is a function of the seed (default 0)")
    parser.add_argument(
        "--size",
        choices=["default", "small"],
        default="default",
        help="default: ~2.3k passages, 2.2k questions; small: a test-sized world",
    )
    parser.add_argument(
        "--phrasing",
        choices=PHRASINGS,
        default="default",
        help="question wording: paraphrase rewords every template (same corpus, answers and gold passages); "
        "alternate is a third wording, for the warm-up to train on",
    )


def run(args: argparse.Namespace) -> int:
    kind = WORLD_KINDS[args.world]
    out = write_world(args.out, args.seed, kind.sizes[args.size], args.phrasing, overwrite=args.overwrite, kind=kind)
    print((out / "world.json").read_text(), end="")
    return 0
