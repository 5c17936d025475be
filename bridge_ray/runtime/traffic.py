"""Bytes that cross between nodes when one actor's output is handed to an actor on another node, per phase.

The graph moves its data (trajectories, answer scores, adapters, policy weights) from actor to actor as object
refs: the coordinator passes a ref that one actor returned to a call on another, and Ray copies the object to the
consumer's node. While a :class:`Traffic` ledger is recording (:func:`recording`), every call an
:class:`~bridge_ray.runtime.actor_group.ActorGroup` sends reports its refs here: the refs it returns are produced
on the called actor's node, and a ref among its arguments (at any depth: lists, dicts, dataclasses) produced on
another node is one copy of that object to the called actor's node, counted once per (object, node). Sizes are
Ray's own (``ray.experimental.get_object_locations``). What the ledger does not see: calls an actor makes itself
(a sampler's searches on the shard holders, the retriever learner's document embeddings) and the plain values
the coordinator sends or fetches (questions, summaries, metrics).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import ray
from ray._private.state import actors

_ledger: Traffic | None = None


@dataclasses.dataclass(frozen=True)
class Crossing:
    """One object copied to another node: in which phase, from which node to which, and its bytes."""

    phase: str
    source: str
    target: str
    bytes: int


class Traffic:
    """The ledger: which node produced each ref, and which refs were handed to actors on other nodes."""

    def __init__(self, phase: str) -> None:
        self.phase = phase  # set by the caller as its phases begin
        self._origin: dict[ray.ObjectRef, str] = {}
        self._nodes: dict[str, str] = {}  # actor id -> node id
        self._handed: dict[tuple[ray.ObjectRef, str], tuple[str, str]] = {}  # (ref, target) -> (phase, source)

    def sent(self, actor: ray.actor.ActorHandle, args: Sequence[Any], results: Sequence[ray.ObjectRef]) -> None:
        """Record one call on ``actor``: the refs among ``args`` it will fetch, and the ``results`` it produces."""
        node = self._node(actor)
        for ref in refs_in(args):
            source = self._origin.get(ref)
            if source is not None and source != node:
                self._handed.setdefault((ref, node), (self.phase, source))
        for ref in results:
            self._origin[ref] = node

    def _node(self, actor: ray.actor.ActorHandle) -> str:
        """The node ``actor`` runs on, from the GCS's actor table (which needs no dashboard)."""
        actor_id = actor._actor_id.hex()
        if actor_id not in self._nodes:
            self._nodes[actor_id] = actors(actor_id=actor_id)["Address"]["NodeID"]
        return self._nodes[actor_id]

    def crossings(self) -> list[Crossing]:
        """Every copy between nodes recorded so far, with its size (read while the ledger still holds the refs)."""
        refs = list({ref for ref, _ in self._handed})
        sizes = {ref: info["object_size"] for ref, info in ray.experimental.get_object_locations(refs).items()}
        return [Crossing(phase, source, target, int(sizes.get(ref) or 0))
                for (ref, target), (phase, source) in self._handed.items()]


def bytes_by_phase(crossings: Sequence[Crossing], phases: Sequence[str]) -> dict[str, int]:
    """Bytes copied between nodes in each of ``phases`` (zero where nothing crossed), in that order."""
    totals: dict[str, int] = defaultdict(int)
    for crossing in crossings:
        totals[crossing.phase] += crossing.bytes
    return {phase: totals[phase] for phase in phases}


def refs_in(value: Any) -> Iterator[ray.ObjectRef]:
    """The object refs in ``value``, at any depth of lists, tuples, sets, dicts and dataclasses."""
    if isinstance(value, ray.ObjectRef):
        yield value
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from refs_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from refs_in(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from refs_in(getattr(value, field.name))


def ledger() -> Traffic | None:
    """The ledger recording now in this process, if any (what :class:`ActorGroup` reports its calls to)."""
    return _ledger


@contextlib.contextmanager
def recording(phase: str) -> Iterator[Traffic]:
    """Record the calls of every actor group of this process while the block runs, starting in ``phase``."""
    global _ledger
    _ledger = Traffic(phase)
    try:
        yield _ledger
    finally:
        _ledger = None
