#!/usr/bin/env bash
# Session-4 CPU run (issue 8): ONE bench invocation with HF-eager autoregressive (the reference),
# compiled static autoregressive with and without the few-row linear layout
# (dynatree.kernels.cpu_linear), and every strategy on both engines. Every compiled bucket is
# built before the warm-up. Idle machine, 2 threads.
set -u
out=benchmarks/cpu
common="--dataset licenses --max-prompt-tokens 128 --threads 2 --no-progress"
C="engine=static:compile=true"
AR="autoregressive:cpu_linear=false@ar-hf-eager,autoregressive@ar-hf,autoregressive:$C:cpu_linear=false@ar-compiled-blas,autoregressive:$C@ar-compiled"
S=""
for s in "linear:k=1@linear-1" "linear:k=3@linear-3" "dynatree:max_nodes=3@dynatree-3" "dynatree@dynatree" \
         "fixed:depth=3:branch=2:max_nodes=16@fixed-16" "dyspec:max_nodes=16@dyspec-16" \
         "dyspec-threshold:threshold=0.05:max_nodes=32@dyspec-thr"; do
  name=${s%@*}; label=${s#*@}
  S="$S,$name@$label,$name:$C@$label-compiled"
done
timeout 3000 dynatree bench --buckets 1,2,4,8,16,32,64 --strategies "$AR$S" --num-prompts 4 --max-new-tokens 96 \
  --warmup 1 --warmup-tokens 32 $common --output $out/engines.jsonl
