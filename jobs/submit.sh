#!/usr/bin/env bash
# Submit a training run to a running Ray cluster as a Ray job; uploads this checkout (see jobs/runtime_env.yaml).
# RAY_ADDRESS names the cluster's dashboard (default http://127.0.0.1:8265, where `ray dashboard clusters/aws.yaml`
# or `kubectl port-forward` puts it). Runs on bash 3.2 (macOS) too.
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: jobs/submit.sh [--no-wait] CONFIG [--resume | --auto-resume] [--dry-run] [key.sub=value ...]
  CONFIG     a config file inside this checkout, e.g. jobs/configs/qwen2.5-3b-bridge.yaml
  --no-wait  return once the job is submitted instead of streaming its logs
  The rest goes to `python -m bridge_ray train`. Set run.output_dir to a directory on shared storage
  (e.g. run.output_dir=/mnt/shared/runs/3b): checkpoints and --resume live there.
EOF
  exit 2
}

cd "$(dirname "$0")/.."
wait_flag=()
if [[ ${1:-} == --no-wait ]]; then wait_flag=(--no-wait); shift; fi
[[ $# -ge 1 && ${1:-} != -* ]] || usage
config=$1; shift
[[ -f $config ]] || { echo "error: $config: no such config file in $(pwd)" >&2; usage; }
[[ $config != /* ]] || { echo "error: give CONFIG relative to the repo root; the job runs in an uploaded copy" >&2; exit 2; }
if [[ " $* " != *" run.output_dir="* ]]; then
  echo "note: run.output_dir comes from $config; it must be on storage every node can read" >&2
fi

# Ray sends the cluster's auth token only in token mode: turn it on when a token is at hand, as `ray start` does.
if [[ -z ${RAY_AUTH_MODE:-} && ( -n ${RAY_AUTH_TOKEN:-} || -f ${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token} ) ]]; then
  export RAY_AUTH_MODE=token
fi
address=${RAY_ADDRESS:-http://127.0.0.1:8265}
id="bridge-$(basename "$config" .yaml)-$(date +%Y%m%d-%H%M%S)"
echo "submission id: $id"
echo "  follow: ray job logs --address $address --follow $id"
echo "  status: ray job status --address $address $id"
echo "  stop:   ray job stop --address $address $id"
exec ray job submit --address "$address" --submission-id "$id" --working-dir . \
  --runtime-env jobs/runtime_env.yaml ${wait_flag[@]+"${wait_flag[@]}"} -- python -m bridge_ray train --config "$config" "$@"
