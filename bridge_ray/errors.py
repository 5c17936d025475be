"""The one base class for bad input: the CLI prints it as ``error: <message>`` and exits 2, with no traceback.

The message names the culprit (file:line, config key, field or folder) and what to do about it. Checks that can
all run report every problem at once (:class:`Problems`, :class:`InputErrors`: one ``error:`` line each).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class InputError(ValueError):
    """Bad input from the user (a file, a flag, a config value, a folder); never a bug of ours."""

    @property
    def problems(self) -> list[str]:
        """One message per ``error:`` line the CLI prints."""
        return [str(self)]


class InputErrors(InputError):
    """Every problem that independent checks found, reported together: a user fixes them all in one go instead of
    meeting them one run at a time."""

    def __init__(self, problems: Sequence[str]) -> None:
        self._problems = list(problems)
        super().__init__("\n".join(self._problems))

    @property
    def problems(self) -> list[str]:
        return self._problems


class Problems:
    """Collects the :class:`InputError`\\ s of checks that do not depend on each other (``with problems.check():``
    around each), then raises them as one :class:`InputErrors`."""

    def __init__(self) -> None:
        self.found: list[str] = []

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except InputError as exc:
            self.found.extend(exc.problems)

    def raise_any(self) -> None:
        if self.found:
            raise InputErrors(self.found)


def refuse_unwritable(out: Path, flag: str = "--out") -> None:
    """Refuse an output path that cannot be created: below a file, or in a folder this user may not write to.

    Checked before any work starts, so a long build or export never ends in a ``NotADirectoryError``.
    """
    path = Path(out).absolute()
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{flag} {out}: {parent} is a file, so nothing can be written below it; "
                                 "choose a path under a folder")
            target = path if path.exists() else parent
            if not os.access(target, os.W_OK | (os.X_OK if target.is_dir() else 0)):
                raise InputError(f"{flag} {out}: {target} is not writable by this user; choose another {flag}")
            return


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
    refuse_unwritable(out)
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not names or overwrite:
        return
    listed = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
    if marker is None:
        holds = f"files ({listed})"
    else:
        holds = f"{what} ({listed})" if marker in names else f"files that are not {what} ({listed})"
    raise refuse_existing_output(str(out), holds, remedy)
