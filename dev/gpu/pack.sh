#!/usr/bin/env bash
# Builds into dev/gpu/wheels/ (git-ignored) the wheels a CUDA image with torch, transformers and pytest lacks for
# `make gpu-check` and the benches: pydantic (config), DeepSpeed (ZeRO-2 check), the pinned peft and FAISS (bench
# retriever-update), at the versions constraints.txt pins, for the image's Python (GPU_PYTHON=3.12 by default).
# No Ray: the checks run in one process. About 25 MiB in all, under the 64 MiB a device call carries;
# dev/gpu/check.sh installs them there. With --graph, also $out/graph/ for dev/gpu/graph.sh (the actor graph): Ray
# repacked by slim_wheel.py (75.6 -> 31.3 MiB: no Java worker, no Ray libraries beyond core, no symbols) and
# Ray's requirements the image lacks (jsonschema and its deps). GPU_WHEELS picks another folder (a local check).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${GPU_WHEELS:-dev/gpu/wheels}
python=${PYTHON:-.venv/bin/python}
pip="$python -m pip --disable-pip-version-check"
pins() { for name in "$@"; do grep -i -E "^${name}==" constraints.txt || { echo "pack.sh: $name is not pinned in constraints.txt" >&2; exit 1; }; done; }
download() { $pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 "$@"; }
rm -rf "$out" && mkdir -p "$out"
download -d "$out" $(pins pydantic pydantic_core annotated-types typing-inspection typing_extensions \
  hjson peft faiss-cpu)
# DeepSpeed publishes a source archive only; built without its compiled ops (DS_BUILD_OPS=0) the wheel is pure
# Python and loads on any Python 3. Its build imports torch, hence --no-build-isolation in the project's venv.
DS_BUILD_OPS=0 $pip wheel -q --no-deps --no-build-isolation -w "$out" $(pins deepspeed)
if [ "${1:-}" = --graph ]; then
  mkdir -p "$out/graph/full"
  download -d "$out/graph" $(pins jsonschema jsonschema-specifications referencing rpds-py)
  download -d "$out/graph/full" $(pins ray)
  # Left out: the Java worker, Ray's libraries (a core ray.init + actors + placement groups imports none), the
  # dashboard's source map (its built client stays: the dashboard head may refuse to start without it) and the
  # runtime-env agent's own aiohttp (the image has aiohttp and its deps; the agent falls back to them).
  $python dev/gpu/slim_wheel.py "$out"/graph/full/ray-*.whl "$out/graph" ray/jars/ ray/rllib/ ray/data/ ray/serve/ \
    ray/tune/ ray/train/ ray/llm/ '*.js.map' ray/_private/runtime_env/agent/thirdparty_files/
  rm -r "$out/graph/full"
fi
ls -R "$out"
# What a device call carrying $out moves: the working tree's tracked and untracked-not-ignored files, and $out.
tree=$({ git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c%s 2>/dev/null | awk '{s+=$1} END {print s}')
wheels=$(find "$out" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
awk -v t="$tree" -v w="$wheels" 'BEGIN {printf "travels: tree %.1f MiB + wheels %.1f MiB = %.1f MiB (keep it under 60)\n", t/2^20, w/2^20, (t+w)/2^20}'
