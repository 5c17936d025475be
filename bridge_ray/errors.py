"""The one base class for bad input: the CLI prints it as ``error: <message>`` and exits 2, with no traceback.

The message names the culprit (file:line, config key, field or folder) and what to do about it.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user (a file, a flag, a config value, a folder); never a bug of ours."""


def refuse_existing_output(folder: str, holds: str, remedy: str) -> InputError:
    """The error for an output folder that already holds another run's or build's results.

    ``holds`` says what is there ("checkpoints of rounds 248-250"); ``remedy`` lists the flags that
    take it over ("pass --resume to continue it, or --overwrite to replace it").
    """
    return InputError(f"{folder} already holds {holds}; {remedy}")
