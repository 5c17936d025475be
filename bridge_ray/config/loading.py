"""Loading a configuration: YAML files (with ``base:`` chains) + ``key.sub=value`` overrides -> :class:`Config`.

A key written twice in a file is an error, rather than the last one silently winning, and a validation error
names the key, the file and the line (or the command-line override it came from).

Values are YAML 1.1 as PyYAML reads it, except that ``1e-5``, ``1E5`` and ``.5e-3`` are floats (as in YAML
1.2 and Python), not strings. Floats must be finite unless a field opts in (``algorithm.retriever.gamma``,
where ``.inf`` means RAG only).

Paths the job reads (:data:`INPUT_PATHS`) are made absolute when loading, so a config works from any
directory and its dump works from anywhere: a relative path written in a config file is relative to that
file's directory, one given on the command line to the current directory, and in both a path starting with
``bridge_ray/`` names a file of the installed package (the presets' prompt templates). Output paths
(``run.output_dir``, ``checkpoint.dir``) stay relative to the current directory.

A key can be deleted rather than set, so a preset's map (``data.eval``) loses one entry without being restated:
``~data.eval.bamboogle`` on the command line, ``~bamboogle: null`` under ``data: eval:`` in a file that names a
``base:``. Deleting a key nothing set is an error naming it.

Code derives a config from another (a stage's run, greedy decoding, a bench's arm) with :func:`derive`, by the same
dotted keys and the same validation, so a derived config holds only what a user could write.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from bridge_ray.config.renamed import move_renamed_keys, respell_values
from bridge_ray.config.schema import BUILD_KEYS, Config
from bridge_ray.errors import InputError


class ConfigError(InputError):
    """A configuration problem; the message names the file, line or override, and the key."""


# Keys naming files or directories the job reads: made absolute when loading (see the module docstring).
INPUT_PATHS: tuple[tuple[str, ...], ...] = (
    ("policy", "prompt_template"),
    ("warmup", "data"),
    ("data", "train"),
    ("data", "eval"),
    ("retrieval", "index", "dir"),
    ("retrieval", "encoder", "adapter"),
    ("run", "continue_from"),
)
PACKAGE_PARENT = Path(__file__).parents[2]  # the directory holding bridge_ray/: "bridge_ray/..." names its files

# YAML 1.1 floats need a dot and a signed exponent; this adds 1e-5, 1E5, 2.5e3, .5e-3 (YAML 1.2's and Python's).
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, plus exponent floats; a key written twice is an error rather than last-one-wins."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first_line[key]})", key_node.start_mark
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))


def _key_lines(root: yaml.Node | None) -> dict[tuple[str, ...], int]:
    """Line number (1-based) of every mapping key and list item in a YAML document, by key path."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):  # list items by index, as validation errors locate them
            for i, item in enumerate(node.value):
                lines[(*path, str(i))] = item.start_mark.line + 1
                walk(item, (*path, str(i)))

    if root is not None:
        walk(root, ())
    return lines


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    finally:
        loader.dispose()
    if data is None:
        return {}, _key_lines(root)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data, _key_lines(root)


def apply_override(data: dict[str, Any], override: str) -> tuple[str, ...]:
    """Apply one override in place; returns the key path.

    ``a.b.c=value`` sets a key (value parsed as YAML; an item of a list by its index, ``stages.1.rounds=3``).
    ``~a.b.c`` (no ``=``, as in Hydra) deletes a key the config files or an earlier override set, e.g. one eval set
    of a preset's ``data.eval`` without restating the map; a key that is not set is an error (a default cannot be
    deleted), and so is a list item (restate the list)."""
    delete = override.startswith("~")
    key, sep, raw = override.removeprefix("~").partition("=")
    path = tuple(key.strip().split("."))
    if delete and sep:
        raise ConfigError(f"override {override!r}: ~key.sub deletes a key and takes no value")
    if not (sep or delete) or not all(path):
        raise ConfigError(f"override {override!r}: expected key.sub=value, or ~key.sub to delete a key")
    try:
        value = yaml.load(raw, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: value is not valid YAML: {exc}") from None
    _set_key(data, path, None if delete else value, f"override {override!r}", delete=delete)
    return path


def _set_key(data: dict[str, Any], path: tuple[str, ...], value: Any, label: str, *, delete: bool = False) -> None:
    """Set (or delete) the key ``path`` of a raw config in place, creating the sections it lies in; errors start
    with ``label`` (the override or the derivation that asked)."""
    key = ".".join(path)
    unset = ConfigError(f"{label}: {key} is not set, so there is nothing to delete "
                        "(only a key a config file or an earlier override sets can be deleted)")
    node: Any = data
    for i, part in enumerate(path):
        if isinstance(node, list):  # an item of a list of sections, by its index: stages.1.rounds=3
            if not part.isdigit() or int(part) >= len(node):
                items = f"items 0 to {len(node) - 1}" if node else "no items"
                raise ConfigError(f"{label}: {'.'.join(path[:i])} has {items}, not {part!r}")
            part = int(part)
        elif not isinstance(node, dict):
            raise ConfigError(f"{label}: {'.'.join(path[:i])} is not a section")
        if i == len(path) - 1:
            break
        if delete and isinstance(node, dict) and part not in node:
            raise unset
        if isinstance(node, dict) and node.get(part) is None and path[i + 1].isdigit():
            raise ConfigError(f"{label}: {'.'.join(path[: i + 1])} has no items, not {path[i + 1]!r}")
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    if not delete:
        node[part] = value
    elif isinstance(node, list):
        raise ConfigError(f"{label}: {'.'.join(path[:-1])} is a list: restate it without the item")
    elif part not in node:
        raise unset
    else:
        del node[part]


AnySection = TypeVar("AnySection", bound=BaseModel)


def derive(section: AnySection, changes: Mapping[str, Any], *, source: str) -> AnySection:
    """``section`` (a whole :class:`Config` or one of its sections) with ``changes`` (dotted keys, as overrides
    write them, to values), validated as :func:`load_config` validates: the one way code derives a config (a
    stage's run, a greedy evaluation, a bench's arm), so a derived config holds only what a user could write.

    The keys ``section`` set stay the only ones set besides ``changes`` (``retrieval.index``'s build keys are
    compared with a prebuilt index's manifest only where set). An invalid change is a :class:`ConfigError`
    naming the key and ``source``, who derived it."""
    data = section.model_dump(exclude_unset=True)
    places: dict[tuple[str, ...], str] = {}
    for key, value in changes.items():
        path = tuple(key.split("."))
        _set_key(data, path, value, f"{source}: {key}")
        places[path] = f"{source}: {key}={value!r}"
    try:
        return type(section).model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source, {}, places, type(section))) from None


def _absolute(value: Any, base: Path) -> Any:
    """A path (or a list or mapping of paths) made absolute against ``base``; anything else is left to validation."""
    if isinstance(value, list):
        return [_absolute(v, base) for v in value]
    if isinstance(value, dict):
        return {k: _absolute(v, base) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    path = Path(os.path.expanduser(value))
    if not path.is_absolute():
        path = (PACKAGE_PARENT if path.parts[:1] == ("bridge_ray",) else base) / path
    return os.path.normpath(path)


def _resolve_input_paths(data: dict[str, Any], base: Path) -> None:
    """Make every relative path of :data:`INPUT_PATHS` in ``data`` absolute against ``base``, in place."""
    for key in INPUT_PATHS:
        section: Any = data
        for part in key[:-1]:
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict) and key[-1] in section:
            section[key[-1]] = _absolute(section[key[-1]], base)


def _suggestion(loc: tuple[str, ...], root: type[BaseModel]) -> str:
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if part.isdigit():  # an item of a list of sections (stages.0.name)
            continue
        field = model.model_fields.get(part) if model else None
        annotation = field.annotation if field else None
        if get_origin(annotation) is list:
            annotation = get_args(annotation)[0]
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    if model is None:
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(model.model_fields)})"


def _source(
    key: tuple[str, ...], lines: dict[tuple[str, ...], str], overrides: dict[tuple[str, ...], str]
) -> str | None:
    """Where ``key`` got its value: the override that set it or a section holding it (it replaced what the file
    said), else the ``file:line`` of the key or of its nearest section (in the preset or in its base)."""
    prefixes = [key[:n] for n in range(len(key), 0, -1)]
    override = next((overrides[p] for p in prefixes if p in overrides), None)
    if override is not None:
        return override
    return next((lines[p] for p in prefixes if p in lines), None)


def _mention(message: str, key: tuple[str, ...]) -> int:
    """Where ``message`` names ``key`` (dotted, as a whole word), or -1."""
    match = re.search(rf"\b{re.escape('.'.join(key))}\b", message)
    return match.start() if match else -1


def _named_keys(loc: tuple[str, ...], message: str, keys: set[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The deepest of ``keys`` below ``loc`` that ``message`` names as a section's cross-field check words them
    (relative to the section: ``max_action_length`` in ``rollout``, ``optim.mini_batch_size`` at the top), in the
    message's order."""
    named = [k for k in keys if len(k) > len(loc) and k[: len(loc)] == loc and _mention(message, k[len(loc) :]) >= 0]
    deepest = [k for k in named if not any(len(o) > len(k) and o[: len(k)] == k for o in named)]
    return sorted(deepest, key=lambda k: _mention(message, k[len(loc) :]))


def _where(
    loc: tuple[str, ...],
    message: str,
    source: str,
    lines: dict[tuple[str, ...], str],
    overrides: dict[tuple[str, ...], str],
) -> str:
    """The overrides and file lines that set what an error is about: the keys a section's check names, else ``loc``
    (a cross-field error sits on the section, but the culprit is the key the user set, not the section)."""
    keys = _named_keys(loc, message, {*lines, *overrides}) or [loc]
    places = dict.fromkeys(filter(None, (_source(k, lines, overrides) for k in keys)))
    return ", ".join(places) or source


def _format_errors(
    exc: ValidationError,
    source: str,
    lines: dict[tuple[str, ...], str],
    overrides: dict[tuple[str, ...], str],
    root: type[BaseModel] = Config,
) -> str:
    out = [f"invalid configuration ({source}):"]
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        key = ".".join(loc) or "config"
        message = err["msg"].removeprefix("Value error, ")
        where = _where(loc, message, source, lines, overrides)
        if err["type"] == "extra_forbidden":
            message = "unknown key" + _suggestion(loc, root)
        out.append(f"  {key}: {message} [{where}]")
    return "\n".join(out)


def _drop_places(lines: dict[tuple[str, ...], str], key: tuple[str, ...]) -> None:
    """Forget where ``key`` and everything below it were set (the value was replaced or deleted)."""
    for place in [k for k in lines if k[: len(key)] == key]:
        del lines[place]


def _merge(
    base: dict[str, Any],
    over: dict[str, Any],
    base_lines: dict[tuple[str, ...], str],
    over_lines: dict[tuple[str, ...], str],
    path: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``over`` on top of ``base``: a key written ``~key: null`` deletes ``key`` from the base first (so
    ``~eval: null`` beside ``eval: {...}`` replaces that section whole); then sections merge key by key and any
    other value (a list too) replaces the base's. What is deleted or replaced loses its places in ``base_lines``;
    deleting a key the base does not set is an error at the ``~key``'s ``file:line`` (``over_lines``)."""
    merged = dict(base)
    deletions = [key for key in over if isinstance(key, str) and key.startswith("~")]
    for key in deletions:
        target, where = (*path, key[1:]), over_lines[(*path, key)]
        if over[key] is not None:
            raise ConfigError(f"{where}: {key} deletes {'.'.join(target)} and takes no value (write {key}: null)")
        if key[1:] not in merged:
            raise ConfigError(f"{where}: {key} cannot delete {'.'.join(target)}: no base file sets it")
        del merged[key[1:]]
        _drop_places(base_lines, target)
    for key, value in over.items():
        if key in deletions:
            continue
        sub = (*path, str(key))
        if isinstance(value, dict):  # a section: merged into the base's, or checked for deletions against nothing
            if not isinstance(merged.get(key), dict):
                _drop_places(base_lines, sub)
            merged[key] = _merge(merged.get(key) if isinstance(merged.get(key), dict) else {}, value, base_lines,
                                 over_lines, sub)
            continue
        merged[key] = value
        _drop_places(base_lines, sub)
    return merged


def _read_config_file(
    path: Path, chain: tuple[Path, ...] = (), rebase: Path | None = None
) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """A config file with its input paths made absolute, on top of the file its ``base:`` key names (relative to
    its own folder, any depth of bases; ``rebase`` in its place when given), less the keys it deletes (``~key:
    null``, see :func:`_merge`); the ``file:line`` of every key, in whichever file set it."""
    data, key_lines = _read_yaml(path)
    lines = {key: f"{path}:{line}" for key, line in key_lines.items()}
    here = Path(os.path.normpath(os.path.abspath(path)))
    _resolve_input_paths(data, here.parent)
    if rebase is not None:
        data.pop("base", None)
        data["base"], lines[("base",)] = os.path.abspath(rebase), f"{path} (based on {rebase} instead)"
    if "base" not in data:
        return _merge({}, data, {}, lines), lines
    base_ref, where = data.pop("base"), lines.pop(("base",))
    if not isinstance(base_ref, str) or not base_ref:
        raise ConfigError(f"{where}: base must be the path of another config file, got {base_ref!r}")
    base_path = Path(os.path.normpath(here.parent / os.path.expanduser(base_ref)))
    if base_path in (*chain, here):
        cycle = " -> ".join(map(str, (*chain, here, base_path)))
        raise ConfigError(f"{where}: base {base_ref!r} makes a cycle ({cycle})")
    if not base_path.is_file():
        raise ConfigError(f"{where}: base config file {base_path} does not exist")
    base_data, base_lines = _read_config_file(base_path, (*chain, here))
    merged = _merge(base_data, data, base_lines, lines)
    return merged, base_lines | lines


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), base: str | Path | None = None
) -> Config:
    """Load ``path`` (or the defaults when None) on top of its ``base:`` file if it names one (``base`` in its
    place when given: ``bench learn`` runs its schedule presets on top of its ``--config``), apply overrides,
    validate; raise :class:`ConfigError`."""
    rebase = None if base is None else Path(base)
    data, lines = _read_config_file(Path(path), rebase=rebase) if path is not None else ({}, {})
    applied = {apply_override(data, o): f"override {o!r}" for o in overrides}
    _resolve_input_paths(data, Path.cwd())  # what is still relative came from the command line
    try:
        move_renamed_keys(data, lines | applied)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    respell_values(data, lines | applied)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, str(path) if path else "defaults", lines, applied)) from None


def dump_config(config: Config) -> str:
    """The fully resolved config as YAML (round-trips through :func:`load_config`, ``.inf`` included).

    Beside a prebuilt ``retrieval.index.dir``, the build-only keys it did not set are left out: their defaults
    describe no index, and preflight would hold them against the prebuilt one's manifest when it is loaded again.
    """
    data = config.model_dump()
    index = config.retrieval.index
    if index.dir is not None:
        dropped = set(BUILD_KEYS) - set(index.build_keys_set())
        data["retrieval"]["index"] = {k: v for k, v in data["retrieval"]["index"].items() if k not in dropped}
    return yaml.safe_dump(data, sort_keys=False)
