#!/usr/bin/env bash
# The CUDA checks on a GPU machine whose python3 already holds CUDA torch, transformers and pytest (no registry
# needed): installs dev/gpu/wheels/ (made by dev/gpu/pack.sh) into a throwaway --target folder put first on
# PYTHONPATH, then runs `make gpu-check` (or its pytest command where make is missing). Extra arguments go to pytest.
# Afterwards `PYTHONPATH=$GPU_SITE python3 -m bridge_ray bench learner --out F.json` runs the learner bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PY:-python3}
site=${GPU_SITE:-/tmp/bridge-ray-gpu-site}
ls dev/gpu/wheels/*.whl >/dev/null || { echo "check.sh: no wheels in dev/gpu/wheels: run dev/gpu/pack.sh" >&2; exit 1; }
$py -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade --target "$site" \
  dev/gpu/wheels/*.whl
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
$py -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.cuda.get_device_name())'
if command -v make >/dev/null; then
  make gpu-check PY="$py" PYTEST_ARGS="$*"
else
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DS_ACCELERATOR=cuda $py -m pytest -m cuda --noconftest -p no:cacheprovider \
    tests/gpu "$@"
fi
