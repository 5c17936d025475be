"""``--out``: where every benchmark's figures go."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bridge_ray.atomic import write_text_atomic


def write_figures(path: str | Path, figures: dict[str, Any]) -> None:
    """Every benchmark's figures as one JSON document, written atomically."""
    write_text_atomic(Path(path), json.dumps(figures, indent=2) + "\n")
