#!/usr/bin/env bash
# Issue 14's goal run: every strategy against our autoregressive decoding and HF's own greedy
# generate, in one process per prompt set, on the held-out long-form offline sets, eager engine,
# the default (independent) distilled draft. 1 thread: the 2-core VM ran the test suite beside it.
set -u
out=benchmarks/cpu
SPEC="autoregressive,hf-generate,linear:k=4,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu,dynatree,dyspec:max_nodes=16@dyspec-16"
for ds in wiki-offline books-offline; do
  dynatree bench --dataset $ds --num-prompts 3 --max-prompt-tokens 256 --max-new-tokens 96 --warmup 1 --threads 1 \
    --no-progress --strategies "$SPEC" --output $out/goal.jsonl
done
# the feature-conditioned head on the same prompts (its own run: one --draft per bench)
for ds in wiki-offline books-offline; do
  dynatree bench --dataset $ds --num-prompts 3 --max-prompt-tokens 256 --max-new-tokens 96 --warmup 1 --threads 1 \
    --no-progress --draft smollm2-135m-feature --strategies "autoregressive,linear:k=4,dynatree" --output $out/goal_feature.jsonl
done
# 2 threads on the otherwise idle machine (the few-row layout is on from 2 threads)
dynatree bench --dataset books-offline --num-prompts 3 --max-prompt-tokens 256 --max-new-tokens 96 --warmup 1 --threads 2 \
  --no-progress --strategies "autoregressive,hf-generate,linear:k=4,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu,dynatree" \
  --output $out/goal_2threads.jsonl
