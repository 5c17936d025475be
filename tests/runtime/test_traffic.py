"""The traffic ledger's pure parts: which refs a call's arguments hold, and the bytes per phase."""

from dataclasses import dataclass
from typing import NamedTuple

import ray

from bridge_ray.runtime.traffic import Crossing, bytes_by_phase, refs_in


def ref(n: int) -> ray.ObjectRef:
    return ray.ObjectRef(n.to_bytes(28, "big"))


class Pair(NamedTuple):
    left: ray.ObjectRef
    right: ray.ObjectRef


@dataclass(frozen=True)
class Rows:
    trajectories: list[ray.ObjectRef]
    advantages: list[float]


def test_refs_are_found_at_any_depth_of_the_arguments():
    args = (ref(1), [ref(2), {"a": ref(3)}], Pair(ref(4), ref(5)), Rows([ref(6)], [0.5]), "text", 3, None)
    assert list(refs_in(args)) == [ref(i) for i in range(1, 7)]
    assert list(refs_in(Rows)) == []  # a dataclass type is not an instance: nothing to walk


def test_bytes_are_summed_per_phase_in_the_order_asked():
    crossings = [Crossing("sync", "b", "a", 70), Crossing("retriever_update", "a", "b", 30),
                 Crossing("sync", "b", "c", 70)]
    assert bytes_by_phase(crossings, ("rollout", "retriever_update", "sync")) == {
        "rollout": 0, "retriever_update": 30, "sync": 140}
