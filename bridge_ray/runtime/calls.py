"""Waiting on remote calls: a time limit that names the actors, and actor death as its own error.

Every wait on an actor or a task (the role groups' collections and start-ups, the shard holders' fan-outs, an actor
fetching the refs it was given, the driver's tasks between graphs) goes through :func:`get_within`, so a hang
becomes a :class:`TimeoutError` naming the config key of its limit and a dead process an :class:`ActorLost` that
says which actors were being waited on, at the first failure rather than after the slowest survivor (a rank whose
peer died would otherwise sit in a collective until the gloo/NCCL timeout). No ``ray.get`` outside this package
waits without a limit (``tests/unit/test_actor_calls.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import ray

T = TypeVar("T")


class ActorLost(RuntimeError):
    """An actor's process died (killed, OOM, preempted node) while we waited on it."""


class ActorRestarting(ActorLost):
    """The actor died and Ray is restarting it: calls sent now fail until the constructor has run again."""


class StateLost(ActorLost):
    """A restarted actor was called before it was given the run's current state: it died while idle (killed
    between calls, e.g. for memory), so no call failed and nobody primed it. Handled like a death in the call:
    the group primes it and sends the call again. An actor raises it itself (:func:`restarted_actor`)."""


def restarted_actor() -> bool:
    """Whether this process is a Ray actor that Ray restarted: its constructor is running again, from the
    arguments it was first given, not from the state its owner has since sent it."""
    if not ray.is_initialized():
        return False
    context = ray.get_runtime_context()
    return context.get_actor_id() is not None and context.was_current_actor_reconstructed


def get_within(refs: Any, timeout_s: float | None, what: str, limit: str = "run.call_timeout_s") -> Any:
    """``ray.get(refs)`` that fails at the first error, within ``timeout_s`` (the config key ``limit``; None, which
    that key allows, waits as long as it takes), naming ``what``."""
    single = isinstance(refs, ray.ObjectRef)
    pending = [refs] if single else list(refs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while pending:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            if not ready:
                raise TimeoutError(f"{what} did not answer within {timeout_s:g}s ({limit})")
            ray.get(ready)  # raises now if that call failed, before waiting for the others
        return ray.get(refs)
    except ray.exceptions.RayActorError as exc:
        if isinstance(exc, ray.exceptions.RayTaskError):
            raise  # the call itself raised (possibly about another actor); its actor is alive
        lost = ActorRestarting if isinstance(exc, ray.exceptions.ActorUnavailableError) else ActorLost
        raise lost(f"{what}: actor died ({type(exc).__name__}: {_first_line(exc)})") from exc


def run_task(
    fn: Callable[..., T], *args: Any, options: Mapping[str, Any], timeout_s: float | None, what: str, limit: str
) -> T:
    """``fn(*args)`` as a Ray task with ``options`` (its resources), waited for like an actor's call
    (:func:`get_within`): the driver's work between graphs (the warm-up, the other worlds' evaluations)."""
    return get_within(ray.remote(**options)(fn).remote(*args), timeout_s, what, limit)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
