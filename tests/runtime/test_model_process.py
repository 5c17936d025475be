"""A process that loads models keeps transformers from importing scikit-learn (see runtime/model_process.py)."""

import subprocess
import sys

LOADS_GENERATION = "import transformers.generation.utils, sys; print('sklearn' in sys.modules)"


def _imports_sklearn(prelude: str) -> bool:
    done = subprocess.run([sys.executable, "-c", prelude + LOADS_GENERATION], capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stdout.strip() == "True"


def test_transformers_generation_loads_no_scikit_learn_after_the_skip():
    assert _imports_sklearn(""), "scikit-learn is installed: transformers imports it unless told otherwise"
    skip = "from bridge_ray.runtime.model_process import skip_transformers_sklearn; skip_transformers_sklearn(); "
    assert not _imports_sklearn(skip)
