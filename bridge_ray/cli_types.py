"""Argparse ``type=`` functions shared by every command and bench: a flag's value is refused while the command
line is parsed, before any model loads or folder is made, with a message naming what is wrong.

argparse prints ``<prog>: error: argument --flag: <message>`` and exits 2, so each message says only what the
value should be.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _whole(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None


def positive_int(text: str) -> int:
    """A count that makes no sense at 0 or below (rounds, questions, steps)."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    """A count or seed where 0 is meaningful (untimed rounds, an index, a seed)."""
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def positive_float(text: str) -> float:
    """A finite quantity above 0 (a learning rate, a span, CPUs)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return value


def _items(text: str) -> list[str]:
    """The comma-separated items of ``text``; an empty one (``0,,1``, a trailing comma) is refused."""
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item; write the values separated by single commas")
    return items


def _distinct(items: list, text: str) -> list:
    if repeated := sorted({str(i) for i in items if items.count(i) > 1}):
        raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(repeated)} more than once")
    return items


def seed_list(text: str) -> list[int]:
    """Comma-separated seeds (``0,1,2``): whole numbers of 0 or more, each once."""
    return _distinct([non_negative_int(item) for item in _items(text)], text)


def positive_float_list(text: str) -> list[float]:
    """Comma-separated numbers above 0 (``0.1,0.5,1``), each once."""
    return _distinct([positive_float(item) for item in _items(text)], text)


def name_list(choices: tuple[str, ...] | None = None) -> Callable[[str], list[str]]:
    """A ``type=`` for comma-separated names, each once, each one of ``choices`` when given."""

    def names(text: str) -> list[str]:
        items = _distinct(_items(text), text)
        if choices is not None and (unknown := [item for item in items if item not in choices]):
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return items

    names.__name__ = "name_list"
    return names
