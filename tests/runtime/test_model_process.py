"""A process that loads models keeps transformers from importing what no role uses (runtime/model_process.py)."""

import json
import subprocess
import sys

from bridge_ray.runtime.model_process import UNUSED_BY_ROLES

LOADS_MODELS = ("import json, sys, transformers.generation.utils, transformers.loss.loss_utils; "
                f"print(json.dumps([name for name in {list(UNUSED_BY_ROLES)!r} if name in sys.modules]))")


def _imported(prelude: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", prelude + LOADS_MODELS], capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout)


def test_transformers_loads_none_of_the_unused_libraries_after_the_skip():
    assert _imported("") == list(UNUSED_BY_ROLES), "installed: transformers imports them unless told otherwise"
    skip = "from bridge_ray.runtime.model_process import skip_unused_transformers_imports as skip; skip(); "
    assert _imported(skip) == []
