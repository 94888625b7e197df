#!/usr/bin/env bash
# Spec-Bench layout on the embedded pair: the six held-out instruct sets (2 prompts each), greedy,
# 192 new tokens, every draft source beside HF's own decoders, in ONE run (ratios side by side).
#   bash benchmarks/instruct/run.sh [OUT.jsonl] [extra dynatree bench flags]
set -eu
cd "$(dirname "$0")/../.."
out=${1:-benchmarks/instruct/cpu.jsonl}
shift || true
dynatree bench --dataset instruct --num-prompts 12 --max-prompt-tokens 1024 --max-new-tokens 192 \
  --threads 2 --warmup 1 --output "$out" \
  --strategies "autoregressive,hf-generate,hf-prompt-lookup,hf-assisted,dynatree@dynatree-model,dynatree:source=text@dynatree-text,dynatree:source=hybrid@dynatree-hybrid" \
  "$@"
dynatree report "$out" --out "${out%.jsonl}-report"
