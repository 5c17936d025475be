"""``in_fresh_process``: another process, its messages in order, its errors with their type, its death noticed."""

from __future__ import annotations

import os
import signal
from concurrent.futures.process import BrokenProcessPool

import pytest

from bridge_ray.errors import InputError
from bridge_ray.fresh_process import in_fresh_process


def _pid_and_messages(count: int, log) -> int:
    for i in range(count):
        log(f"message {i}")
    return os.getpid()


def _pid() -> int:
    return os.getpid()


def _bad_input(path: str) -> None:
    raise InputError(f"{path}:3: no such key")


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_runs_in_another_process_and_forwards_every_message_in_order():
    messages: list[str] = []
    pid = in_fresh_process(_pid_and_messages, 500, log=messages.append)
    assert pid != os.getpid()
    assert messages == [f"message {i}" for i in range(500)]
    assert in_fresh_process(_pid) not in (os.getpid(), pid)  # a new process every call


def test_an_error_arrives_with_its_type_and_message():
    with pytest.raises(InputError, match=r"warmup\.jsonl:3: no such key"):
        in_fresh_process(_bad_input, "warmup.jsonl")


def test_a_killed_child_raises_instead_of_hanging():
    with pytest.raises(BrokenProcessPool):
        in_fresh_process(_killed)
