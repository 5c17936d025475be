#!/usr/bin/env bash
# Builds into jobs/gpu/wheels/ (git-ignored) the wheels a CUDA image with torch, transformers and pytest lacks for
# `make gpu-check` and the benches: pydantic (config), DeepSpeed (ZeRO-2 check), the pinned peft and FAISS (bench
# retriever-update), at the versions constraints.txt pins, for the image's Python (GPU_PYTHON=3.12 by default).
# No Ray: the checks run in one process. About 25 MiB in all, under the 64 MiB a device call carries;
# jobs/gpu/check.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=jobs/gpu/wheels
python=${PYTHON:-.venv/bin/python}
pip="$python -m pip --disable-pip-version-check"
pins() { for name in "$@"; do grep -i -E "^${name}==" constraints.txt || { echo "pack.sh: $name is not pinned in constraints.txt" >&2; exit 1; }; done; }
rm -rf "$out" && mkdir -p "$out"
$pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" \
  --platform manylinux_2_28_x86_64 $(pins pydantic pydantic_core annotated-types typing-inspection typing_extensions \
  hjson peft faiss-cpu)
# DeepSpeed publishes a source archive only; built without its compiled ops (DS_BUILD_OPS=0) the wheel is pure
# Python and loads on any Python 3. Its build imports torch, hence --no-build-isolation in the project's venv.
DS_BUILD_OPS=0 $pip wheel -q --no-deps --no-build-isolation -w "$out" $(pins deepspeed)
du -sh "$out" && ls "$out"
