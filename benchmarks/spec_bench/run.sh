#!/usr/bin/env bash
# Spec-Bench's own questions on the embedded pair (SmolLM2-135M-Instruct + the shipped distilled
# draft): 2 questions per task (MT-bench's with both turns: 14 prompts), greedy, 192 new tokens;
# our autoregressive decoding, the default hybrid tree, the text alone, and HF's generate, prompt
# lookup and assisted generation (the draft exported), in ONE run (ratios side by side).
# --max-prompt-tokens 2048 fits every Spec-Bench question (the longest summarization prompt is
# ~1,600 tokens with SmolLM2's chat template).
#   bash benchmarks/spec_bench/run.sh [OUT.jsonl] [extra dynatree bench flags, e.g. --num-prompts 80]
set -eu
cd "$(dirname "$0")/../.."
out=${1:-benchmarks/spec_bench/cpu.jsonl}
shift || true
dynatree bench --dataset spec-bench --num-prompts 2 --max-prompt-tokens 2048 --max-new-tokens 192 \
  --threads 2 --warmup 1 --output "$out" \
  --strategies "autoregressive,dynatree:source=hybrid@hybrid,dynatree:source=text@text,hf-generate,hf-prompt-lookup,hf-assisted" \
  "$@"
dynatree report "$out" --out "${out%.jsonl}-report"
