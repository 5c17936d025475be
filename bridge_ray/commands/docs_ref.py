"""The guide's generated pages: the CLI reference from the live parser and the configuration reference from the
schema, so neither can drift from the code.

``python -m bridge_ray.commands.docs_ref`` rewrites ``docs/cli.md`` and ``docs/configuration.md``; ``--check``
only says which are stale (exit 1). ``tests/unit/test_docs_site.py`` runs the same comparison.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bridge_ray.cli import build_parser
from bridge_ray.config.reference import REGENERATE, cell, code, config_reference

USAGE_WIDTH = 100  # fixed, so the page does not depend on the terminal that generated it
PLAIN_GROUPS = {"positional arguments", "options", "optional arguments"}
CLI_HEADER = f"""# Command-line reference

`bridge-ray <command>` (or `python -m bridge_ray <command>`) runs one step of the workflow. Every command that
reads a config takes `--config FILE` and trailing `key.sub=value` overrides; the
[configuration reference](configuration.md) lists the keys. `bridge-ray <command> --help` prints the same as this
page.

<!-- Generated from the argument parser by `{REGENERATE}`: edit the commands' help, not this page. -->
"""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's sub-parsers by name (empty when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(parser.formatter_class, width=USAGE_WIDTH)
    return parser.format_usage().strip()


def argument_name(action: argparse.Action) -> str:
    """How the argument is written: ``--out DIR``, ``--dry-run``, ``key.sub=value ...``."""
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if action.choices and not action.metavar:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    if not action.option_strings:
        return f"{metavar} ..." if action.nargs in ("*", "+") else str(metavar)
    takes_value = action.nargs != 0
    return ", ".join(f"{flag} {metavar}" if takes_value else flag for flag in action.option_strings)


def default_text(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0 or default in (None, argparse.SUPPRESS, []):
        return ""
    return code(" ".join(map(str, default)) if isinstance(default, list | tuple) else str(default))


def argument_table(parser: argparse.ArgumentParser, actions: Sequence[argparse.Action]) -> list[str]:
    expand: Callable[[argparse.Action], str] = parser._get_formatter()._expand_help
    rows = ["| Argument | Default | Description |", "| --- | --- | --- |"]
    for action in actions:
        text = expand(action) if action.help else ""
        rows.append(f"| {code(argument_name(action))} | {default_text(action)} | {cell(text)} |")
    return rows


def documented(actions: Sequence[argparse.Action]) -> list[argparse.Action]:
    """The arguments a reader sets: not ``--help``, hidden ones or the sub-command choice."""
    return [action for action in actions if action.help != argparse.SUPPRESS
            and not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)]


def argument_groups(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    """(title, arguments) per group: argparse's own groups as one untitled table, options first."""
    plain = [group for group in parser._action_groups if group.title in PLAIN_GROUPS]
    named = [group for group in parser._action_groups if group.title not in PLAIN_GROUPS]
    flags = [action for group in plain for action in group._group_actions if action.option_strings]
    positionals = [action for group in plain for action in group._group_actions if not action.option_strings]
    found = [("", documented([*flags, *positionals]))]
    found += [(str(group.title) + (f": {group.description}" if group.description else ""),
               documented(group._group_actions)) for group in named]
    return [(title, actions) for title, actions in found if actions]


def command_block(name: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} {name}", "", cell(parser.description or ""), "", "```text", usage(parser), "```", ""]
    for title, actions in argument_groups(parser):
        lines += [f"**{cell(title)}**", ""] if title else []
        lines += [*argument_table(parser, actions), ""]
    for sub_name, sub in subcommands(parser).items():
        lines += command_block(f"{name} {sub_name}", sub, level + 1)
    return lines


def cli_reference() -> str:
    """The whole page: a table of the commands, then each command (and each benchmark) with its arguments."""
    parser = build_parser()
    commands = subcommands(parser)
    lines = [CLI_HEADER, "| Command | What it does |", "| --- | --- |"]
    lines += [f"| [`{name}`](#{name.replace(' ', '-')}) | {cell(sub.description or '')} |"
              for name, sub in commands.items()]
    lines.append("")
    for name, sub in commands.items():
        lines += command_block(name, sub, 2)
    return "\n".join(lines).rstrip("\n") + "\n"


PAGES: dict[str, Callable[[], str]] = {"cli.md": cli_reference, "configuration.md": config_reference}


def stale_pages(docs: Path) -> list[str]:
    """The generated pages under ``docs`` that differ from what the code gives now."""
    return [name for name, page in PAGES.items()
            if not (docs / name).is_file() or (docs / name).read_text() != page()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bridge_ray.commands.docs_ref", description=__doc__)
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="the guide's folder (default: docs)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.docs)
        for name in stale:
            print(f"stale: {args.docs / name} (regenerate: {REGENERATE})", file=sys.stderr)
        return 1 if stale else 0
    for name, page in PAGES.items():
        (args.docs / name).write_text(page())
        print(f"wrote {args.docs / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
