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
# 10. the history sweep again on an idle machine (the first one shared the CPU), smaller trees, length scaling
dynatree sweep --strategy dynatree --grid window=4,8,16 --grid target_accept=0.25,0.35,0.5 --baselines autoregressive --num-prompts 4 --max-new-tokens 64 --warmup 1 $common --output $out/sweep_history_idle.jsonl
dynatree bench --strategies "autoregressive,linear:k=1,linear:k=2,dynatree:max_nodes=1,dynatree:max_nodes=2,dynatree:max_nodes=3" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/small_trees.jsonl
dynatree sweep --strategy dynatree --grid max_nodes=4 --baselines "autoregressive,linear:k=3,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu" --lengths 100,250,500 --num-prompts 2 --warmup 1 $common --output $out/lengths.jsonl
# 11. compiled static engine again after the static engine got the lazy LM head (compiled body, head per row read)
timeout 1500 dynatree bench --engine static --compile --buckets 1,8,128 --strategies "autoregressive,linear:k=3,dynatree" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/static_compiled_lazy.jsonl
dynatree bench --strategies "autoregressive,linear:k=3,dynatree" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/hf_s3b.jsonl
