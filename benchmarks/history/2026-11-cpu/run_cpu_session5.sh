#!/usr/bin/env bash
# Session-5 CPU runs (issue 14). Busy shared machine: 1 thread (2-thread OpenMP spin-waits made
# every step ~10x slower under the other jobs' load), interleaved configurations, medians.
set -u
export DYNATREE_CACHE_DIR=${DYNATREE_CACHE_DIR:-/tmp/dynatree_cache}
out=benchmarks/cpu
# verify-cost profile + per-round split before/after the lean round + cost-model budget, one process per engine
PYTHONPATH=src python $out/fast_default.py --engine static --prompts 2 --reps 2 --tokens 64 --out $out/fast_default.jsonl
PYTHONPATH=src python $out/fast_default.py --engine hf --prompts 1 --reps 1 --tokens 48 --out $out/fast_default.jsonl
# torch.compile cost of the static engine: cold inductor cache, then a second process with it warm
rm -rf /tmp/dynatree_inductor
TORCHINDUCTOR_CACHE_DIR=/tmp/dynatree_inductor PYTHONPATH=src python $out/compile_cost.py --buckets 1 --out $out/compile_cost.jsonl
TORCHINDUCTOR_CACHE_DIR=/tmp/dynatree_inductor PYTHONPATH=src python $out/compile_cost.py --buckets 1 --out $out/compile_cost.jsonl
