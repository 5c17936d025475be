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
  check_cluster "$address" || return 1
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

# check_cluster ADDRESS: one `error:` line and a non-zero status unless a Ray dashboard with the Jobs API answers at
# ADDRESS (GET /api/version, the token sent where one is at hand), so a wrong address or a closed tunnel fails here
# instead of as a submission id followed by Ray's traceback. Addresses other than http(s)://, and machines
# without curl, go to `ray job submit` unchecked.
check_cluster() {
  local address=${1%/} header="" code
  [[ $address == http://* || $address == https://* ]] && command -v curl >/dev/null || return 0
  if [[ ${RAY_AUTH_MODE:-} == token ]]; then
    header="header = \"Authorization: Bearer ${RAY_AUTH_TOKEN:-$(cat "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" \
      2>/dev/null || true)}\""
  fi
  # The header reaches curl through stdin (-K -), so the token never shows in the process list.
  code=$(printf '%s\n' "$header" | curl -K - -s -o /dev/null -w '%{http_code}' --connect-timeout 5 --max-time 10 \
    "$address/api/version") || true
  case $code in
    200) return 0 ;;
    000|"") echo "error: no Ray cluster answers at $address (nothing listens there, or it timed out): start the" \
              "cluster, or open the tunnel to its dashboard (ray dashboard CLUSTER.yaml, kubectl port-forward)," \
              "or set RAY_ADDRESS" >&2 ;;
    401|403) echo "error: the Ray cluster at $address refused the request (HTTP $code): set RAY_AUTH_TOKEN, or put" \
              "the token \`ray get-auth-token\` prints on the head into ~/.ray/auth_token" >&2 ;;
    *) echo "error: $address answers HTTP $code to /api/version, not as a Ray dashboard with the Jobs API;" \
            "set RAY_ADDRESS to the dashboard's address (port 8265 by default)" >&2 ;;
  esac
  return 1
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
