"""Keys older configs (and runs' saved ``config.yaml``) still set, and what replaced them.

A renamed key still loads: its value moves to the new key, with a note naming the key and where it was set, so a
saved run's ``config.yaml`` (a checkpoint's, which ``eval-mirage`` reads) loads as it did. A removed key is an error
saying what to write instead, rather than "unknown key". The tables are keyed by the section (its dotted path; ""
the top level) the former key sat in.
"""

from __future__ import annotations

import sys
from typing import Any

RENAMED: dict[str, dict[str, str]] = {
    "learner": {
        "num_ranks": "roles.policy_learner.count",
        "cpus_per_rank": "roles.policy_learner.cpus",
        "gpus_per_rank": "roles.policy_learner.gpus",
        "startup_timeout_s": "roles.policy_learner.startup_timeout_s",
    },
    "graph": {
        "num_samplers": "roles.sampler.count",
        "sampler_cpus": "roles.sampler.cpus",
        "sampler_gpus": "roles.sampler.gpus",
        "sampler_max_restarts": "roles.sampler.max_restarts",
        "retriever_learner_cpus": "roles.retriever_learner.cpus",
        "retriever_learner_gpus": "roles.retriever_learner.gpus",
        "torch_threads": "roles.torch_threads",
    },
    "retrieval.index": {
        "shard_num_cpus": "roles.shard_holder.cpus",
        "shard_num_gpus": "roles.shard_holder.gpus",
        "shard_max_restarts": "roles.shard_holder.max_restarts",
    },
    "retrieval.server": {"max_batch_queries": "retrieval.server.batch_size"},
}

REMOVED: dict[str, dict[str, str]] = {
    "": {"graph": "its keys moved to roles (torch_threads is roles.torch_threads)"},
    "retrieval.server": {
        "max_queries_per_request": "a request may hold any number of queries; its body size is limited by "
        "retrieval.server.max_request_bytes",
    },
}


def former_keys(section: str) -> dict[str, str]:
    """Each former key of ``section`` -> the message saying what replaced it."""
    removed = {key: f"{key} was removed: {why}" for key, why in REMOVED.get(section, {}).items()}
    renamed = {key: f"{key} was renamed {new}" for key, new in RENAMED.get(section, {}).items()}
    return removed | renamed


def move_renamed_keys(data: dict[str, Any], places: dict[tuple[str, ...], str]) -> None:
    """Move the value of each renamed key ``data`` (a raw config) sets to its new key, in place, with a note on
    stderr naming both and ``places[key]`` (its ``file:line`` or override), once per process; a section the moves
    leave empty is dropped (``graph:``, whose keys all moved). Raise ``ValueError`` where the new key is set too."""
    for section, table in RENAMED.items():
        node = _node(data, section.split("."))
        for old, new in table.items() if isinstance(node, dict) else ():
            if old not in node:
                continue
            *parents, name = new.split(".")
            target = data
            for part in parents:
                target = target.setdefault(part, {}) if isinstance(target, dict) else None
            former, where = f"{section}.{old}", places.get((*section.split("."), old), "config")
            if not isinstance(target, dict) or name in target:
                raise ValueError(f"{where}: {former} was renamed {new}, which is set too: keep {new} alone")
            target[name] = node.pop(old)
            _note(f"{where}: {former} is now {new}; write that")
        if node == {}:
            *parents, name = section.split(".")
            _node(data, parents).pop(name)


def _node(data: dict[str, Any], path: list[str]) -> Any:
    """The value at ``path`` of a raw config (None where a section on the way is missing or not a mapping)."""
    node: Any = data
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def reject_former_keys(former: dict[str, str], data: Any) -> None:
    """Raise naming what replaced each former key ``data`` (a section's raw mapping) sets."""
    found = [message for key, message in former.items() if isinstance(data, dict) and key in data]
    if found:
        raise ValueError("; ".join(found))


# Values older configs still write, by key: accepted with a note naming the key and where it was set, so that a
# saved run's config.yaml still loads while new configs use one spelling for every dtype key.
DTYPE_KEYS = ("policy.dtype", "learner.dtype", "retrieval.encoder.passage_dtype")
FORMER_DTYPES: dict[str, str] = {
    "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "bf16-autocast": "bfloat16-autocast",
}
_noted: set[str] = set()


def respell_values(data: dict[str, Any], places: dict[tuple[str, ...], str]) -> None:
    """Replace each former dtype spelling ``data`` (a raw config) holds by the current one, in place, with a note
    on stderr naming the key and ``places[key]`` (its ``file:line`` or override), once per process."""
    for key in DTYPE_KEYS:
        *section, name = key.split(".")
        node = _node(data, section)
        value = node.get(name) if isinstance(node, dict) else None
        if isinstance(value, str) and value in FORMER_DTYPES:
            node[name] = FORMER_DTYPES[value]
            _note(f"{places.get(tuple(key.split('.')), 'config')}: {key}: {value} is a former spelling; write "
                  f"{FORMER_DTYPES[value]}")


def _note(message: str) -> None:
    if message not in _noted:
        _noted.add(message)
        print(f"note: {message}", file=sys.stderr)
