"""The configuration reference page (``docs/configuration.md``), written from the schema itself.

Generated rather than hand-kept, so a key's type, default and description cannot drift from what ``load_config``
accepts; ``tests/unit/test_docs_site.py`` fails when the committed page differs from :func:`config_reference`.
"""

from __future__ import annotations

import html
import math
import types
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic.fields import FieldInfo

from bridge_ray.config.renamed import DTYPE_KEYS, FORMER_DTYPES, REMOVED, RENAMED
from bridge_ray.config.schema import Config, Section

# A description holding this phrase marks a key whose setting the paper does not have; the page lists them first.
DEPARTURE = "not in the paper"
REGENERATE = "python -m bridge_ray.commands.docs_ref"
HEADER = f"""# Configuration reference

Every key a config file or a `key.sub=value` override can set, with its type, default and meaning. Defaults are
the paper's open-domain settings; `jobs/configs/` holds the presets. An unknown key or a wrong type is an error that
names the key, so a typo never runs silently. `python -m bridge_ray config --config FILE` prints a config fully
resolved.

<!-- Generated from bridge_ray/config/schema.py by `{REGENERATE}`: edit the schema, not this page. -->
"""


def type_name(annotation: Any) -> str:
    """A field's type as a user writes its value: ``"a" | "b"`` for a choice, ``int | null``, ``list[str]``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(f'"{arg}"' for arg in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(arg) for arg in args)}]"
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    return annotation.__name__


def bounds(info: FieldInfo) -> str:
    """The range the schema enforces (``≥ 1``, ``> 0, < 1``); empty when it has none."""
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥"}
    found = [f"{sign} {getattr(item, name)}" for item in info.metadata for name, sign in signs.items()
             if getattr(item, name, None) is not None]
    return ", ".join(found)


def default_text(info: FieldInfo) -> str:
    """The default as YAML would spell it (``null``, ``true``, ``.inf``)."""
    value = info.get_default(call_default_factory=True)
    if isinstance(value, float) and math.isinf(value):
        return ".inf"
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n").removesuffix("\n...")


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell: no raw HTML, no column breaks, no stray emphasis."""
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|").replace("*", "\\*")


def code(text: str) -> str:
    """Inline code for a table cell. HTML rather than backticks: a ``|`` inside backticks splits the row on GitHub
    and stays escaped in MkDocs, while ``&#124;`` inside ``<code>`` reads as ``|`` on both."""
    escaped = html.escape(text, quote=False)
    return "<code>" + escaped.replace("|", "&#124;").replace("*", "&#42;") + "</code>"


def section_of(info: FieldInfo) -> type[Section] | None:
    """The nested section a field holds (``list[StageConfig]`` counts too), or None for a plain value."""
    annotation = info.annotation
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    return annotation if isinstance(annotation, type) and issubclass(annotation, Section) else None


def sections(model: type[Section], prefix: str = "") -> list[tuple[str, type[Section]]]:
    """Every section under ``model``, depth first, with its dotted path (``stages[]`` for a list's items)."""
    found = []
    for name, info in model.model_fields.items():
        sub = section_of(info)
        if sub is not None:
            path = f"{prefix}{name}" + ("[]" if get_origin(info.annotation) is list else "")
            found.append((path, sub))
            found.extend(sections(sub, f"{path}."))
    return found


def leaves(model: type[Section]) -> list[tuple[str, FieldInfo]]:
    """A section's own keys (its nested sections have their own table)."""
    return [(name, info) for name, info in model.model_fields.items() if section_of(info) is None]


def is_departure(info: FieldInfo) -> bool:
    return DEPARTURE in (info.description or "")


def key_table(path: str, model: type[Section]) -> list[str]:
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, info in leaves(model):
        kind = code(type_name(info.annotation)) + (f", {cell(bounds(info))}" if bounds(info) else "")
        flag = "**Departs from the paper.** " if is_departure(info) else ""
        default = "required" if info.is_required() else code(default_text(info))
        rows.append(f"| {code(f'{path}.{name}')} | {kind} | {default} | "
                    f"{flag}{cell(info.description or '')} |")
    return rows


def section_block(path: str, model: type[Section]) -> list[str]:
    level = "#" * min(2 + path.count("."), 4)
    doc = " ".join((model.__dict__.get("__doc__") or "").split()).replace("``", "`")
    lines = [f"{level} {path}", ""]
    if doc:
        lines += [doc, ""]
    if leaves(model):
        lines += [*key_table(path, model), ""]
    return lines


def departures() -> list[str]:
    """A list of the keys whose settings the paper does not have, each linked to its section."""
    lines = ["## Departures from the paper", "",
             "Keys that add a setting the paper does not have; their defaults keep the paper's behaviour.", ""]
    for path, model in sections(Config):
        anchor = path.replace(".", "").replace("[]", "")
        lines += [f"- [`{path}.{name}`](#{anchor})" for name, info in leaves(model) if is_departure(info)]
    return [*lines, ""]


def former_keys() -> list[str]:
    lines = ["## Renamed and removed keys and values", "",
             "A config that still sets a renamed key loads, its value moved to the new key, with a note saying what to "
             "write instead; one that sets a removed key fails to load with a message saying so.", "",
             "| Former key | Now |", "| --- | --- |"]
    for section, table in RENAMED.items():
        lines += [f"| `{section}.{old}` | renamed `{new}` |" for old, new in table.items()]
    for section, table in REMOVED.items():
        lines += [f"| `{'.'.join(filter(None, (section, old)))}` | removed: {cell(why)} |"
                  for old, why in table.items()]
    keys = ", ".join(f"`{key}`" for key in DTYPE_KEYS)
    lines += ["", f"Former spellings of a dtype ({keys}) still load, with a note saying what to write instead.", "",
              "| Former value | Now |", "| --- | --- |"]
    lines += [f"| `{old}` | `{new}` |" for old, new in FORMER_DTYPES.items()]
    return [*lines, ""]


def config_reference() -> str:
    """The whole page: the departures, then one table per section in schema order, then the former keys."""
    lines = [HEADER, *departures()]
    for path, model in sections(Config):
        lines += section_block(path, model)
    lines += former_keys()
    return "\n".join(lines).rstrip("\n") + "\n"
