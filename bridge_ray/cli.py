"""``python -m bridge_ray <subcommand>``: one module per subcommand under ``bridge_ray.commands``.

Each command module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` and imports
its heavy dependencies inside ``run`` so that ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from bridge_ray import __version__
from bridge_ray.config import Config, load_config
from bridge_ray.errors import InputError

# name -> module; a new subcommand is one line here plus its module.
COMMANDS: dict[str, str] = {
    "train": "bridge_ray.commands.train",
    "eval": "bridge_ray.commands.eval_cmd",
    "sft": "bridge_ray.commands.sft",
    "config": "bridge_ray.commands.config_cmd",
    "bench": "bridge_ray.commands.bench",
    "make-world": "bridge_ray.commands.make_world",
    "prepare-data": "bridge_ray.commands.prepare_data",
    "build-index": "bridge_ray.commands.build_index",
    "serve-retriever": "bridge_ray.commands.serve_retriever",
    "export": "bridge_ray.commands.export",
    "judge": "bridge_ray.commands.judge",
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` plus trailing ``key.sub=value`` overrides (``~key.sub`` deletes a key), shared by every
    config-driven command."""
    parser.add_argument("--config", metavar="FILE",
                        help="YAML config (defaults: the paper's algorithm settings, MiniLM and the bundled world)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="override any config key; ~key.sub deletes one the config sets (quote it in a shell)")


def config_from_args(args: argparse.Namespace, flags: dict[str, object] | None = None) -> Config:
    """The config of ``--config`` + overrides; ``flags`` maps config keys to a command's own flags (None: unset).

    Flags become overrides, so an invalid flag value is reported under the key it sets.
    """
    extra = [f"{key}={json.dumps(value)}" for key, value in (flags or {}).items() if value is not None]
    return load_config(args.config, [*args.overrides, *extra])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bridge-ray", description="Ray-native BRIDGE trainer for search agents.")
    parser.add_argument("--version", action="version", version=f"bridge-ray {__version__}")
    add_subcommands(parser, COMMANDS, "command", "_run")
    return parser


def add_subcommands(parser: argparse.ArgumentParser, registry: dict[str, str], dest: str, handler: str) -> None:
    """One sub-parser per module of ``registry`` (``HELP``, ``add_arguments``, ``run``); ``args.<handler>`` runs it."""
    sub = parser.add_subparsers(dest=dest, metavar=f"<{dest}>", required=True)
    for name, module_name in registry.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP)  # help is %-formatted
        module.add_arguments(cmd)
        cmd.set_defaults(**{handler: module.run})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except InputError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
