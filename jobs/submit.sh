#!/usr/bin/env bash
# Submit a training run to a running Ray cluster as a Ray job; uploads this checkout (see jobs/runtime_env.yaml).
# RAY_ADDRESS names the cluster's dashboard (default http://127.0.0.1:8265, where `ray dashboard clusters/aws.yaml`
# or `kubectl port-forward` puts it). Runs on bash 3.2 (macOS) too.
#
# The one submit path of jobs/: other job scripts (jobs/build_index_wiki18.sh) source this file and call
# `ray_submit`, which every submission goes through:
#   - the runtime env is jobs/runtime_env.yaml (working dir = this checkout, without data/, indexes/, runs/, .venv/);
#   - WANDB_API_KEY and HF_TOKEN, when set here, are passed to the job's env_vars (they are then visible to
#     whoever can read the cluster's job list; logging the nodes in with `wandb login` / `hf auth login` avoids that);
#   - token auth: Ray's CLI sends the cluster's token only when RAY_AUTH_MODE=token, so it is set here whenever a
#     token is at hand (RAY_AUTH_TOKEN, or the file RAY_AUTH_TOKEN_PATH, default ~/.ray/auth_token), as `ray start`
#     does. `ray get-auth-token` prints the token the dashboard asks for.
set -euo pipefail

usage() {
  cat >&2 <<'EOF_USAGE'
usage: jobs/submit.sh [--no-wait] CONFIG [--resume | --auto-resume] [--dry-run] [key.sub=value ...]
  CONFIG     a config file inside this checkout, e.g. jobs/configs/qwen2.5-3b-bridge.yaml
  --no-wait  return once the job is submitted instead of streaming its logs
  The rest goes to `python -m bridge_ray train`. Set run.output_dir to a directory on shared storage
  (e.g. run.output_dir=/mnt/shared/runs/3b): checkpoints and --resume live there.
EOF_USAGE
  exit 2
}

# ray_submit NAME [ray job submit options ...] -- ENTRYPOINT ...: submit ENTRYPOINT from the repo root (the current
# folder) with the runtime env, secrets and auth described above; the submission id is NAME-<date>-<time>.
ray_submit() {
  local name=$1; shift
  local options=()
  while [[ $# -gt 0 && $1 != -- ]]; do options+=("$1"); shift; done
  [[ ${1:-} == -- ]] || { echo "ray_submit: no -- before the entrypoint" >&2; return 2; }
  shift
  if [[ -z ${RAY_AUTH_MODE:-} && ( -n ${RAY_AUTH_TOKEN:-} || -f ${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token} ) ]]; then
    export RAY_AUTH_MODE=token
  fi
  local address=${RAY_ADDRESS:-http://127.0.0.1:8265}
  local id
  id="$name-$(date +%Y%m%d-%H%M%S)"
  local env_file
  env_file=$(mktemp "${TMPDIR:-/tmp}/bridge-ray-runtime-env.XXXXXX")  # mode 0600: it may hold secrets
  _runtime_env > "$env_file"
  echo "submission id: $id"
  echo "  follow: ray job logs --address $address --follow $id"
  echo "  status: ray job status --address $address $id"
  echo "  stop:   ray job stop --address $address $id"
  if [[ ${RAY_AUTH_MODE:-} == token ]]; then
    echo "  token auth: the dashboard at $address asks for the token \`ray get-auth-token\` prints"
  fi
  local rc=0
  ray job submit --address "$address" --submission-id "$id" --working-dir . --runtime-env "$env_file" \
    ${options[@]+"${options[@]}"} -- "$@" || rc=$?
  rm -f "$env_file"
  return $rc
}

# jobs/runtime_env.yaml with WANDB_API_KEY and HF_TOKEN added to its env_vars where set (as YAML double-quoted
# strings, so any character of a key survives).
_runtime_env() {
  local extra="" var value line
  for var in WANDB_API_KEY HF_TOKEN; do
    value=${!var:-}
    [[ -n $value ]] || continue
    value=${value//\\/\\\\}
    value=${value//\"/\\\"}
    extra+="  $var: \"$value\""$'\n'
  done
  while IFS= read -r line || [[ -n $line ]]; do
    printf '%s\n' "$line"
    if [[ $line == env_vars:* ]]; then printf '%s' "$extra"; fi
  done < jobs/runtime_env.yaml
}

main() {
  cd "$(dirname "$0")/.."
  local wait_flag=()
  if [[ ${1:-} == --no-wait ]]; then wait_flag=(--no-wait); shift; fi
  [[ $# -ge 1 && ${1:-} != -* ]] || usage
  local config=$1; shift
  [[ -f $config ]] || { echo "error: $config: no such config file in $(pwd)" >&2; usage; }
  [[ $config != /* ]] || { echo "error: give CONFIG relative to the repo root; the job runs in an uploaded copy" >&2; exit 2; }
  if [[ " $* " != *" run.output_dir="* ]]; then
    echo "note: run.output_dir comes from $config; it must be on storage every node can read" >&2
  fi
  ray_submit "bridge-$(basename "$config" .yaml)" ${wait_flag[@]+"${wait_flag[@]}"} -- \
    python -m bridge_ray train --config "$config" "$@"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then main "$@"; fi
