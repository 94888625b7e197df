#!/usr/bin/env bash
# CPU tensor-parallel benchmark on the offline pair (SmolLM2-135M target, distilled draft):
# 2 processes x 1 thread (target sharded with --tp, draft replicated) against 1 process x 2 threads,
# with and without the few-row CPU layout (which is always off on a sharded target).
# Run from the repository root: bash benchmarks/tp/run.sh   (results in benchmarks/tp/*.jsonl)
set -euo pipefail
OUT=benchmarks/tp
COMMON=(--strategies "autoregressive,dynatree" --num-prompts 3 --max-prompt-tokens 128 --max-new-tokens 48
        --warmup 1 --warmup-tokens 16 --no-progress)
export OMP_NUM_THREADS=1
for rep in ${REPS:-1}; do
  torchrun --nproc-per-node 2 -m dynatree bench --tp --threads 1 "${COMMON[@]}" --output "$OUT/tp2x1.jsonl"
  OMP_NUM_THREADS=2 python -m dynatree bench --threads 2 "${COMMON[@]}" --output "$OUT/1x2.jsonl"
  OMP_NUM_THREADS=2 python -m dynatree bench --threads 2 --no-cpu-linear "${COMMON[@]}" --output "$OUT/1x2-no-cpu-linear.jsonl"
done
