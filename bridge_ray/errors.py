"""The one base class for bad input: the CLI prints it as ``error: <message>`` and exits 2, with no traceback.

The message names the culprit (file:line, config key, field or folder) and what to do about it.
"""

from __future__ import annotations

from pathlib import Path


class InputError(ValueError):
    """Bad input from the user (a file, a flag, a config value, a folder); never a bug of ours."""


def refuse_existing_output(folder: str, holds: str, remedy: str) -> InputError:
    """The error for an output folder that already holds another run's or build's results.

    ``holds`` says what is there ("checkpoints of rounds 248-250"); ``remedy`` lists the flags that
    take it over ("pass --resume to continue it, or --overwrite to replace it").
    """
    return InputError(f"{folder} already holds {holds}; {remedy}")


def refuse_taken_folder(
    out: Path,
    overwrite: bool,
    what: str,
    marker: str | None = None,
    remedy: str = "choose another --out, or pass --overwrite to replace it",
) -> None:
    """Refuse an ``--out`` that is a file, or a folder holding anything (unless ``overwrite``).

    The message lists what is there: ``what`` ("a world") when ``marker`` is among its files, else "files that
    are not ``what``" (just "files" without a marker).
    """
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder")
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not names or overwrite:
        return
    listed = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
    if marker is None:
        holds = f"files ({listed})"
    else:
        holds = f"{what} ({listed})" if marker in names else f"files that are not {what} ({listed})"
    raise refuse_existing_output(str(out), holds, remedy)
