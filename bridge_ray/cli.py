"""``python -m bridge_ray <subcommand>``: one module per subcommand under ``bridge_ray.commands``.

Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``; its name and one-line help sit in
:data:`COMMANDS`, so that ``--help`` lists every command without importing any (torch, Ray and the models load
only with the command that runs).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

from bridge_ray import __version__
from bridge_ray.config import Config, load_config
from bridge_ray.config.renamed import FORMER_DTYPES
from bridge_ray.errors import InputError, refuse_taken_folder


@dataclass(frozen=True)
class Command:
    """A command or bench as ``--help`` lists it; its module (``add_arguments``, ``run``) loads when it runs."""

    module: str
    help: str


# name -> command; a new subcommand is one entry here plus its module.
COMMANDS: dict[str, Command] = {
    "train": Command("bridge_ray.commands.train",
        "train the policy and the retriever adapter with BRIDGE rounds on the Ray actor graph"),
    "eval": Command("bridge_ray.commands.eval_cmd",
        "evaluate a checkpoint greedily on QA files and print the paper's table (EM, F1, cover-EM, recall); "
        "--suite mirage: medical multiple-choice QA (accuracy, judged reasoning)"),
    "warmup": Command("bridge_ray.commands.warmup",
        "warm the policy up on demonstration trajectories (the warm-up; cached by content hash); prints its path"),
    "config": Command("bridge_ray.commands.config_cmd",
        "validate a config (file + overrides) and print it fully resolved as YAML"),
    "bench": Command("bridge_ray.commands.bench", "run a benchmark and print its figures"),
    "make-world": Command("bridge_ray.commands.make_world",
        "write the bundled synthetic world (FlashRAG corpus.jsonl + train/dev/test.jsonl) to a directory"),
    "prepare-data": Command("bridge_ray.commands.prepare_data",
        "write the presets' question files (NQ+HotpotQA train, 7 eval sets) from a FlashRAG root or Search-R1 "
        "parquet, or MedCorp (--medcorp) for eval --suite mirage"),
    "build-index": Command("bridge_ray.commands.build_index",
        "build a sharded FAISS index of a FlashRAG corpus (resumable)"),
    "serve-retriever": Command("bridge_ray.commands.serve_retriever",
        "serve an index (optionally with a trained query adapter) over HTTP in the Search-R1 format"),
    "export": Command("bridge_ray.commands.export",
        "export a checkpoint's retriever (LoRA merged) and policy as HF folders for Search-R1, FlashRAG and vLLM"),
    "judge": Command("bridge_ray.commands.judge",
        "judge the reasoning quality of answered medical questions (JSONL in, JSONL with judge_* fields out)"),
    "cluster-check": Command("bridge_ray.commands.cluster_check",
        "run one short round of the config's graph on the Ray cluster and print where each role landed and the "
        "bytes each phase moved between nodes; exit 1 when the round fails"),
}
# former command name -> the one that replaced it: still runs, with a note on stderr.
RENAMED_COMMANDS: dict[str, str] = {"sft": "warmup"}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` plus trailing ``key.sub=value`` overrides (``~key.sub`` deletes a key), shared by every
    config-driven command."""
    parser.add_argument("--config", metavar="FILE",
                        help="YAML config (defaults: the paper's algorithm settings, MiniLM and the bundled world)")
    add_overrides_argument(parser)


def add_overrides_argument(parser: argparse.ArgumentParser, scope: str = "") -> None:
    """Trailing ``key.sub=value`` overrides, the same on every command and bench (``scope`` says where they apply,
    for a bench that runs several configs)."""
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="override any config key; ~key.sub deletes one the config sets (quote it in a shell)"
                        + (f"; {scope}" if scope else ""))


def config_from_args(args: argparse.Namespace, flags: dict[str, object] | None = None) -> Config:
    """The config of ``--config`` + overrides; ``flags`` maps config keys to a command's own flags (None: unset).

    Flags become overrides, so an invalid flag value is reported under the key it sets.
    """
    extra = [f"{key}={json.dumps(value)}" for key, value in (flags or {}).items() if value is not None]
    return load_config(args.config, [*args.overrides, *extra])


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose refusals are :class:`InputError`s, so that a bad flag is one ``error:`` line and
    exit 2 from :func:`main`, like every other bad input (argparse would print its usage block and exit)."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser(lazy: bool = False) -> argparse.ArgumentParser:
    """The whole command line; ``lazy``: a command's own arguments are added once it is chosen (:func:`main`),
    else every command's now (the reference page, tests that walk every parser)."""
    parser = ArgumentParser(prog="bridge-ray", description="Ray-native BRIDGE trainer for search agents.")
    parser.add_argument("--version", action="version", version=f"bridge-ray {__version__}")
    add_subcommands(parser, COMMANDS, "command", "_run")
    if not lazy:
        load_every(parser)
    return parser


class LazySubcommands(argparse._SubParsersAction):
    """Sub-parsers that get their module's arguments when chosen: the top-level help needs only the registry."""

    def __init__(self, *args: Any, registry: dict[str, Command], handler: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.registry, self.handler = registry, handler
        for name, command in registry.items():  # argparse %-formats the help of each entry
            self.add_parser(name, help=command.help.replace("%", "%%"), description=command.help)

    def load(self, name: str) -> argparse.ArgumentParser:
        """The command's parser, its module's arguments and handler added (once)."""
        sub = self.choices[name]
        if sub.get_default(self.handler) is None:
            module = importlib.import_module(self.registry[name].module)
            module.add_arguments(sub)
            sub.set_defaults(**{self.handler: module.run})
        return sub

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        self.load(values[0])  # argparse has checked the name against the choices
        super().__call__(parser, namespace, values, option_string)


def add_subcommands(parser: argparse.ArgumentParser, registry: dict[str, Command], dest: str, handler: str) -> None:
    """One sub-parser per entry of ``registry``; ``args.<handler>`` runs the chosen one, whose module is imported
    only then (or by :func:`load_every`)."""
    parser.add_subparsers(dest=dest, metavar=f"<{dest}>", required=True, action=LazySubcommands, registry=registry,
                          handler=handler)


def load_every(parser: argparse.ArgumentParser) -> None:
    """Every command's and bench's arguments added now, at every depth."""
    for action in parser._actions:
        if isinstance(action, LazySubcommands):
            for name in action.choices:
                load_every(action.load(name))


def note(message: str) -> None:
    """A deprecation or other notice on stderr, apart from the command's output on stdout."""
    print(f"note: {message}", file=sys.stderr)


class DeprecatedFlag(argparse.Action):
    """A former flag name: sets what the new one sets, with a note saying which to write (hidden from --help)."""

    def __init__(self, option_strings: list[str], dest: str, replacement: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.replacement = replacement

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        note(f"{option_string} is deprecated; write {self.replacement}")
        setattr(namespace, self.dest, values)


def add_deprecated_flag(parser: argparse.ArgumentParser, old: str, new: str, **kwargs: Any) -> None:
    """``old`` as a hidden alias of the flag ``new`` (same dest, same choices), so older scripts keep working."""
    parser.add_argument(old, dest=new.lstrip("-").replace("-", "_"), action=DeprecatedFlag, replacement=new,
                        **kwargs)


def dtype_name(value: str) -> str:
    """A ``--dtype`` flag's value in the config's spelling (``float32``, ``bfloat16``); a former spelling (``fp32``,
    ``bf16``) still works, with a note."""
    if value in FORMER_DTYPES:
        note(f"--dtype {value} is a former spelling; write {FORMER_DTYPES[value]}")
        return FORMER_DTYPES[value]
    return value


# --out and its kin: one declaration says whether the path is a file or a folder; main checks it before the
# command does any work and, when the command fails, removes what it created and left empty.
OutKind = Literal["file", "folder"]
KIND_WORDS: dict[str, str] = {"file": "a file", "folder": "a folder"}


@dataclass(frozen=True)
class OutputFlag:
    """An output path flag of one command (:func:`add_out_argument`)."""

    flag: str
    kind: OutKind | Callable[[argparse.Namespace], OutKind]
    resumable: bool = False  # the command itself judges what the path holds (it resumes there)
    overwrite: bool = True  # --overwrite was declared with it (add_out_argument: once per command)
    what: str = "files"  # what a folder of this command holds, for the refusal: "a world"
    marker: str | None = None  # the file that marks one ("world.json")
    remedy: str = "choose another --out, or pass --overwrite to replace it"

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def kind_for(self, args: argparse.Namespace) -> OutKind:
        return self.kind(args) if callable(self.kind) else self.kind


def add_out_argument(
    parser: argparse.ArgumentParser,
    kind: OutKind | Callable[[argparse.Namespace], OutKind],
    help: str,
    *,
    flag: str = "--out",
    required: bool = False,
    metavar: str | None = None,
    overwrite: str | None = None,
    **folder: Any,
) -> None:
    """Declare an output path; its help says whether it is a file or a folder (``kind``, or a function of the
    other flags where they decide). A file that exists, or a folder that holds something, is refused unless
    ``--overwrite`` or ``resumable=True`` (the command resumes there, judging what it finds); ``folder`` holds
    :class:`OutputFlag`'s ``resumable``, ``what``, ``marker`` and ``remedy``.

    ``--overwrite`` is declared here, once per command: ``overwrite`` is its help where the command gives it a
    meaning of its own; an output that is not resumable gets the plain one (replace what is there), a resumable
    one none unless ``overwrite`` says what it does."""
    if isinstance(kind, str):
        help = f"{KIND_WORDS[kind]}: {help}"
        metavar = metavar or ("FILE" if kind == "file" else "DIR")
    parser.add_argument(flag, required=required, metavar=metavar, help=help)
    declared = parser.get_default("_outputs") or []
    if overwrite is None and not folder.get("resumable", False):
        overwrite = f"replace what {flag} already holds"
    if overwrite is not None and not any(o.overwrite for o in declared):
        parser.add_argument("--overwrite", action="store_true", help=overwrite)
    parser.set_defaults(_outputs=[*declared, OutputFlag(flag, kind, overwrite=overwrite is not None, **folder)])


def check_output(args: argparse.Namespace, output: OutputFlag) -> None:
    """Refuse the path before any work: below a file, the wrong kind, not writable, a file that exists or a
    folder that holds something (unless ``--overwrite``, or the command resumes there)."""
    value = getattr(args, output.dest, None)
    if value is None:
        return
    path, kind = Path(value), output.kind_for(args)
    problem = _below_file(path) or _wrong_kind(path, kind) or _unwritable(path)
    if problem is not None:
        raise InputError(f"{output.flag} {value}: {problem}")
    if output.resumable:
        return
    overwrite = getattr(args, "overwrite", False)
    if kind == "folder":
        refuse_taken_folder(path, overwrite, output.what, output.marker, output.remedy)
    elif path.exists() and not overwrite:
        raise InputError(f"{output.flag} {value}: the file exists (an earlier result?); choose another "
                         f"{output.flag}, or pass --overwrite to replace it")


def _below_file(path: Path) -> str | None:
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is a file, so nothing can be written below it"
    return None


def _wrong_kind(path: Path, kind: OutKind) -> str | None:
    if kind == "folder" and path.exists() and not path.is_dir():
        return "is a file, not a folder; this command writes a folder here"
    if kind == "file" and path.is_dir():
        return "is a folder, not a file; this command writes one file: name it (e.g. DIR/out.json)"
    return None


def _unwritable(path: Path) -> str | None:
    """The path, or its nearest existing folder, where this user may not write."""
    existing = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if os.access(existing, os.W_OK | (os.X_OK if existing.is_dir() else 0)):
        return None
    return f"{existing} is not writable by this user"


class CreatedPaths:
    """What a command may create for an output path, recorded before it runs, so that a failed command (an
    exception or a non-zero exit) leaves nothing behind: the folder, its lock file beside it and the missing
    folders above it are removed when empty. Files it wrote stay (a resumable command's earlier work, or a
    partial result it reports)."""

    def __init__(self, path: Path) -> None:
        path = path.absolute()
        self.missing = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
        self.lock = path.with_name(f"{path.name}.lock")
        self.new_lock = not self.lock.exists()

    def remove_if_empty(self) -> None:
        if self.new_lock:
            self.lock.unlink(missing_ok=True)
        for folder in self.missing:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def main(argv: Sequence[str] | None = None) -> int:
    argv = _renamed_command(list(sys.argv[1:] if argv is None else argv))
    created: list[CreatedPaths] = []
    try:
        args = build_parser(lazy=True).parse_args(argv)
        for output in getattr(args, "_outputs", None) or []:
            check_output(args, output)
            if getattr(args, output.dest, None) is not None:
                created.append(CreatedPaths(Path(getattr(args, output.dest))))
        code = int(args._run(args) or 0)
    except InputError as exc:
        _remove_if_empty(created)
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except BaseException:
        _remove_if_empty(created)
        raise
    if code != 0:
        _remove_if_empty(created)
    return code


def _remove_if_empty(created: list[CreatedPaths]) -> None:
    for paths in created:
        paths.remove_if_empty()


def _renamed_command(argv: list[str]) -> list[str]:
    """``argv`` with a former command name replaced by its new one (and a note saying so)."""
    if argv and argv[0] in RENAMED_COMMANDS:
        note(f"the {argv[0]} command is now {RENAMED_COMMANDS[argv[0]]}; {argv[0]} will be removed")
        return [RENAMED_COMMANDS[argv[0]], *argv[1:]]
    return argv
