"""The shard holders as the other roles call them: a typed handle over their :class:`ActorGroup`.

:class:`ShardHolders` is the :class:`~bridge_ray.retrieval.client.ShardCalls` of a
:class:`~bridge_ray.retrieval.client.ShardSet` over the actors: it sends the :class:`IndexShard` methods
themselves (never their names) to the shards a fan-out needs and collects them within the group's call limit,
naming the method and the index. The graph holds the group it started (:func:`~bridge_ray.shard_holder.group.
start_shard_holders`); a sampler or the retriever learner is given its actors by name and attaches to them
(:meth:`ShardHolders.attach`), calling them within ``run.call_timeout_s``. They restart under
:attr:`Restart.RETRY`: Ray restarts a dead holder and retries the searches sent to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import ray

from bridge_ray.config import Config
from bridge_ray.retrieval.shard import IndexShard
from bridge_ray.runtime.actor_group import ActorGroup, NamedActors, Restart

ROLE = "shard_holder"
RESTART = Restart.RETRY
T = TypeVar("T")


class ShardHolders:
    """The shard-holder actors, one per shard of an index, in shard-id order."""

    def __init__(self, group: ActorGroup) -> None:
        self.group = group

    @classmethod
    def attach(cls, named: NamedActors, config: Config) -> ShardHolders:
        """The holders ``named`` as another actor of ``config``'s graph calls them (within ``run.call_timeout_s``)."""
        return cls(ActorGroup.attach(named, call_timeout_s=config.run.call_timeout_s))

    def __len__(self) -> int:
        return len(self.group)

    def named(self) -> NamedActors:
        """The holders by name: what the samplers and the retriever learner are given (:meth:`attach`)."""
        return self.group.named()

    def fan_out(self, method: Callable[..., T], args: Mapping[int, tuple]) -> list[T]:
        """``method(*args[i])`` on holder ``i`` for every key, all at once; the results in the keys' order."""
        calls = [self.group.call(i, method, *a) for i, a in args.items()]
        return self.group.collect(calls, method.__name__).values

    def shared(self, value: Any) -> ray.ObjectRef:
        """One copy of ``value`` in the object store, which every holder's call reads."""
        return ray.put(value)

    def loaded(self) -> list[dict]:
        """Every holder's :meth:`IndexShard.info`, once its shard has loaded."""
        return self.fan_out(IndexShard.info, {i: () for i in range(len(self))})

    def close(self) -> None:
        """Nothing to release here: the holders are their starter's to end (:meth:`shutdown`)."""

    def shutdown(self) -> None:
        self.group.shutdown()
