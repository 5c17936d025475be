"""Result files read back through one schema each: a damaged or hand-made file is refused naming the file and the
field, never met later as a ``KeyError`` or a wrong figure.

Every reader of a JSON result (an evaluation table, a kept evaluation, a bench's figures it resumes from) calls
:func:`read_record` with the pydantic model of what it expects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from bridge_ray.errors import InputError, InputErrors

Record = TypeVar("Record", bound=BaseModel)
SHOWN_PROBLEMS = 8  # a file wrong everywhere is named by its first problems, not hundreds of lines


def read_record(path: str | Path, model: type[Record], what: str) -> Record:
    """The JSON object at ``path`` checked against ``model``; an :class:`InputError` naming the file (and its line,
    or the field) when it cannot be read, is not JSON or does not fit. ``what`` names the expected file in the
    message ("an evaluation file")."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; expected {what} (JSON)") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not JSON ({e.msg}); expected {what}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not {what}: expected a JSON object, found a {type(data).__name__}")
    return validated(data, model, str(path))


def validated(data: Mapping[str, Any], model: type[Record], source: str) -> Record:
    """``data`` checked against ``model``; one ``error:`` line per problem, each naming ``source`` and the field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InputErrors([f"{source}: {field_path(error['loc'])}: {error['msg']}"
                           for error in e.errors()[:SHOWN_PROBLEMS]]) from None


def field_path(loc: tuple[str | int, ...]) -> str:
    """A pydantic error location as one path: ``questions.nq.recall[3]``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(the whole file)"
