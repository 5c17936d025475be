#!/usr/bin/env bash
# The actor graph on one GPU: the main job (`python -m bridge_ray train`, the code path of `make demo`) for 2 rounds
# of the small world on a local Ray instance, where the policy learner (DeepSpeed ZeRO-2, NCCL, world size 1), the
# HF sampler (its query encoder) and the retriever learner reserve fractions of the GPU, and the shard holders search
# with faiss-cpu. For a CUDA image whose python3 holds torch and transformers but no Ray and no model files: it
# installs dev/gpu/wheels/ and dev/gpu/wheels/graph/ (dev/gpu/pack.sh --graph) into a throwaway --target folder
# put first on PYTHONPATH, builds the tiny random policy and encoder of tests/gpu/cuda_helpers.py from configs
# (dev/gpu/graph_tools.py), and runs the job while graph_tools.py notes which processes hold the GPU.
# The log, that table and the run's records go to $OUT (a temporary folder when unset), with Ray's logs when the job
# fails or outlives GRAPH_TIMEOUT_S (420). Arguments are more overrides of the job. Exits with the job's status.
# GRAPH_GPUS=0 runs the same job on the CPU (all roles gpus 0, DS_ACCELERATOR=cpu): a local check of the wheels
# (with GPU_WHEELS=folder of `GPU_PYTHON=3.11 GPU_WHEELS=folder dev/gpu/pack.sh --graph` for a local Python 3.11).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PY:-python3}
site=${GPU_SITE:-/tmp/bridge-ray-graph-site}
out=${OUT:-$(mktemp -d)}
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
wheels=${GPU_WHEELS:-dev/gpu/wheels}
ls "$wheels"/graph/ray-*.whl >/dev/null || { echo "graph.sh: no Ray wheel: run dev/gpu/pack.sh --graph" >&2; exit 1; }
$py -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade --target "$site" \
  "$wheels"/*.whl "$wheels"/graph/*.whl
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" BRIDGE_RAY_CACHE="$work/cache" HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
if [ "${GRAPH_GPUS:-1}" = 0 ]; then
  export DS_ACCELERATOR=cpu && gpus=(0 0 0)
else
  export DS_ACCELERATOR=cuda && gpus=(0.25 0.25 0.5)  # sampler, retriever learner, policy learner: 1 GPU in all
  $py -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.cuda.get_device_name())'
fi
$py dev/gpu/graph_tools.py models "$work/models"
mapfile -t models < "$work/models/overrides.txt"
$py dev/gpu/graph_tools.py watch "$out/where.txt" & watcher=$!
rc=0  # 4 questions x 8 rollouts a round: the random policy then writes a few searches, so the retriever learns too
timeout "${GRAPH_TIMEOUT_S:-420}" $py -m bridge_ray train --overwrite --config jobs/configs/local_cpu.yaml \
  "${models[@]}" run.output_dir="$work/run" run.rounds=2 data.world_size=small warmup.enabled=false \
  rollout.questions_per_batch=4 algorithm.grpo.rollouts_per_question=8 algorithm.grpo.kl_coef=0.0 \
  rollout.max_response_length=320 rollout.max_observation_length=128 rollout.max_action_length=24 \
  algorithm.retriever.num_candidates=4 optim.mini_batch_size=2 eval.before_training=false eval.after_training=true \
  eval.max_questions=2 telemetry.ray_metrics=false telemetry.wandb_mode=disabled roles.sampler.gpus="${gpus[0]}" \
  roles.retriever_learner.gpus="${gpus[1]}" roles.policy_learner.gpus="${gpus[2]}" "$@" 2>&1 | tee "$out/graph.log" \
  || rc=$?
kill "$watcher" && wait "$watcher" || true
cp "$work"/run/{phases.jsonl,eval.jsonl,eval_after.md,config.yaml} "$out"/ 2>/dev/null || true
[ "$rc" = 0 ] || tar czf "$out/ray-logs.tgz" -C /tmp/ray/session_latest logs 2>/dev/null || true
echo "graph.sh: job exit status $rc; outputs in $out: $(ls "$out" | tr '\n' ' ')"
exit "$rc"
