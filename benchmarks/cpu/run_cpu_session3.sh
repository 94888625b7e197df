#!/usr/bin/env bash
# Session-3 CPU runs (after the history sweep): main table with the swept defaults, StreamingLLM
# eviction, and the compiled static engine with every bucket precompiled. Idle machine, 2 threads.
set -u
out=benchmarks/cpu
common="--dataset licenses --max-prompt-tokens 128 --threads 2 --no-progress"
SPEC="autoregressive,linear:k=3,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu,dynatree,dyspec:max_nodes=16@dyspec-16,dyspec-threshold:threshold=0.05:max_nodes=32@dyspec-thr"
# 7. main table again with the defaults chosen by the history sweep (a* = 0.25)
dynatree bench --strategies "$SPEC" --num-prompts 6 --max-new-tokens 96 --warmup 1 $common --output $out/main_s3.jsonl
# 8. StreamingLLM-style eviction (4 sinks + 128 recent tokens) for every strategy, AR included
dynatree bench --kv-window 128 --strategies "autoregressive,linear:k=3,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu,dynatree" --num-prompts 2 --max-new-tokens 320 --warmup 1 --warmup-tokens 16 $common --output $out/streaming.jsonl
# 9. compiled static engine: all buckets (1, 8, 128) compiled before warm-up, then hf-engine AR of the same prompts
timeout 1500 dynatree bench --engine static --compile --buckets 1,8,128 --strategies "autoregressive,linear:k=3,dynatree" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/static_compiled_s3.jsonl
dynatree bench --strategies "autoregressive,linear:k=3,dynatree" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/hf_s3.jsonl
