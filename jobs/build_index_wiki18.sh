#!/usr/bin/env bash
# Build the wiki-18 (FlashRAG, ~21M passages) E5-base-v2 index as a Ray job on one GPU worker.
# The build is resumable: after a preemption, submit the same job again and it continues at its last
# checkpoint. CORPUS and OUT must be on storage that the shard-holder actors' nodes can read later.
# Submitted through jobs/submit.sh's ray_submit: runtime env, excludes, secrets and token auth as described there.
set -euo pipefail
cd "$(dirname "$0")/.."
source jobs/submit.sh
CORPUS=${CORPUS:?"set CORPUS to the wiki-18 jsonl (FlashRAG {id, contents})"}
OUT=${OUT:?"set OUT to the index directory on shared storage"}
SHARDS=${SHARDS:-8}
ray_submit bridge-build-index-wiki18 --entrypoint-num-gpus 1 -- \
  python -m bridge_ray build-index --corpus "$CORPUS" --out "$OUT" --encoder intfloat/e5-base-v2 \
  --shards "$SHARDS" --index-type flat --no-progress retrieval.encoder.passage_batch_size=512
