"""Run a function in a fresh (spawned) process and return its result.

Two kinds of work want their own process: a build that trains a model in the driver (the warm-up), whose
gigabytes the allocator would otherwise keep for the rest of the run beside the Ray actors that need them,
and a measurement whose peak memory must be its own (``bench retriever-update``).
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_messages: Any = None  # the child's end of the log queue, set when the child starts
_END = "\0end-of-messages"  # put after fn's last message: the queue delivers in order


def in_fresh_process(fn: Callable[..., T], *args: Any, log: Callable[[str], None] | None = None) -> T:
    """``fn(*args)`` in a spawned process; with ``log``, ``fn(*args, log=...)`` and its messages reach ``log``.

    An exception in ``fn`` is raised here with its type; a child killed outright (the OOM killer) raises
    ``concurrent.futures.process.BrokenProcessPool``, never a hang.
    """
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    with ProcessPoolExecutor(1, mp_context=context, initializer=_keep_queue, initargs=(messages,)) as pool:
        future = pool.submit(_call, fn, args, log is not None)
        while True:  # until the child's end-of-messages mark, or its death
            try:
                message = messages.get(timeout=2 if future.done() else 0.2)
            except queue.Empty:
                if future.done():
                    break
                continue
            if message == _END:
                break
            if log is not None:
                log(message)
        return future.result()


def _keep_queue(messages: Any) -> None:
    global _messages
    _messages = messages


def _call(fn: Callable[..., T], args: tuple, logs: bool) -> T:
    try:
        return fn(*args, log=_messages.put) if logs else fn(*args)
    finally:
        _messages.put(_END)
