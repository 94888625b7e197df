#!/usr/bin/env bash
# The commands behind every current CPU result in benchmarks/cpu/ (RESULTS.md names the step of each
# table), one step per results file, on the offline pair (SmolLM2-135M-Instruct target). Each command
# is the one the session that wrote the file ran (sessions 2-7; their own scripts are records in
# benchmarks/history/2026-11-cpu/). The goal run on the long-form sets is run_cpu_goal.sh.
#
# Run from the repository root on an otherwise idle machine:
#   bash benchmarks/cpu/run_cpu.sh                  # every step, in the order below
#   bash benchmarks/cpu/run_cpu.sh engines t06      # only these steps
# Bench rows carry the machine, library versions and code version (package + git commit) in their
# resume key: a step re-run on another machine or after a code change appends new rows to the same
# file instead of reprinting the recorded ones. The python scripts append (JSONL) or overwrite (JSON).
set -u
out=benchmarks/cpu
common="--dataset licenses --max-prompt-tokens 128 --threads 2 --no-progress"

# session 4: ONE bench invocation, HF-eager AR (the reference), compiled AR with and without the few-row
# layout, every strategy on the hf engine and compiled; every compiled bucket built before the warm-up
step_engines() {
  local C="engine=static:compile=true" S="" s name label
  local AR="autoregressive:cpu_linear=false@ar-hf-eager,autoregressive@ar-hf,autoregressive:$C:cpu_linear=false@ar-compiled-blas,autoregressive:$C@ar-compiled"
  for s in "linear:k=1@linear-1" "linear:k=3@linear-3" "dynatree:max_nodes=3@dynatree-3" "dynatree@dynatree" \
           "fixed:depth=3:branch=2:max_nodes=16@fixed-16" "dyspec:max_nodes=16@dyspec-16" \
           "dyspec-threshold:threshold=0.05:max_nodes=32@dyspec-thr"; do
    name=${s%@*}; label=${s#*@}
    S="$S,$name@$label,$name:$C@$label-compiled"
  done
  timeout 3000 dynatree bench --buckets 1,2,4,8,16,32,64 --strategies "$AR$S" --num-prompts 4 --max-new-tokens 96 \
    --warmup 1 --warmup-tokens 32 $common --output $out/engines.jsonl
}

# session 2: the other draft kind, untrained early exit (first 8 target layers, shared weights)
step_early_exit() {
  dynatree bench --draft early-exit:8 --strategies "autoregressive,linear:k=3,dynatree" --num-prompts 3 --max-new-tokens 48 --warmup 1 $common --output $out/early_exit.jsonl
}

# session 2: sampling at T = 0.6 (acceptance of fixed tree vs DynaTree vs DySpec)
step_t06() {
  dynatree bench --temperature 0.6 --strategies "autoregressive,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu,dynatree,dyspec:max_nodes=16@dyspec-16,dyspec-threshold:threshold=0.05:max_nodes=32@dyspec-thr" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/t06.jsonl
}

# session 2: sweep of the DynaTree values the papers never give (node budget, rho_deep, tau)
step_sweep() {
  dynatree sweep --strategy dynatree --grid max_nodes=4,8,16,32 --grid rho_deep=0.2,0.5 --grid tau=0.02,0.1 --baselines autoregressive --num-prompts 3 --max-new-tokens 64 --warmup 1 $common --output $out/sweep.jsonl
}

# session 3: history sweep W x a* on an idle machine (the first run, history/2026-11-cpu/sweep_history.jsonl, shared the CPU)
step_sweep_history() {
  dynatree sweep --strategy dynatree --grid window=4,8,16 --grid target_accept=0.25,0.35,0.5 --baselines autoregressive --num-prompts 4 --max-new-tokens 64 --warmup 1 $common --output $out/sweep_history_idle.jsonl
}

# session 3: the gates B_mid x rho_stop x eta_D
step_sweep_gates() {
  dynatree sweep --strategy dynatree --grid rho_stop=0.02,0.05,0.1 --grid b_mid=1,2 --grid eta_d=1,2,4 --baselines autoregressive --num-prompts 4 --max-new-tokens 64 --warmup 1 $common --output $out/sweep_gates.jsonl
}

# session 3: StreamingLLM-style eviction (4 sinks + 128 recent tokens) for every strategy, AR included
step_streaming() {
  dynatree bench --kv-window 128 --strategies "autoregressive,linear:k=3,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu,dynatree" --num-prompts 2 --max-new-tokens 320 --warmup 1 --warmup-tokens 16 $common --output $out/streaming.jsonl
}

# session 3: speedup vs generation length; report_lengths/ is `dynatree report` over it
step_lengths() {
  dynatree sweep --strategy dynatree --grid max_nodes=4 --baselines "autoregressive,linear:k=3,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu" --lengths 100,250,500 --num-prompts 2 --warmup 1 $common --output $out/lengths.jsonl
}

# session 5 (1 thread, busy machine): verify-cost profile, per-round split before/after the lean
# round, cost-model budget; one process per engine. The session's own script (run_cpu_session5.sh)
# recorded the first command and a 1-repetition hf run; the hf and the second static run reported in
# RESULTS.md ran with the settings their rows record (1 prompt, 48 tokens, 2 repetitions).
step_fast_default() {
  export DYNATREE_CACHE_DIR=${DYNATREE_CACHE_DIR:-/tmp/dynatree_cache}
  PYTHONPATH=src python $out/fast_default.py --engine static --prompts 2 --reps 2 --tokens 64 --out $out/fast_default.jsonl
  PYTHONPATH=src python $out/fast_default.py --engine hf --prompts 1 --reps 2 --tokens 48 --out $out/fast_default.jsonl
  PYTHONPATH=src python $out/fast_default.py --engine static --prompts 1 --reps 2 --tokens 48 --out $out/fast_default.jsonl
}

# session 5: torch.compile cost of the static engine, cold inductor cache, then a second process with it warm
step_compile_cost() {
  rm -rf /tmp/dynatree_inductor
  TORCHINDUCTOR_CACHE_DIR=/tmp/dynatree_inductor PYTHONPATH=src python $out/compile_cost.py --buckets 1 --out $out/compile_cost.jsonl
  TORCHINDUCTOR_CACHE_DIR=/tmp/dynatree_inductor PYTHONPATH=src python $out/compile_cost.py --buckets 1 --out $out/compile_cost.jsonl
}

# session 5: eager hf vs eager static engine in one process (1 prompt x 48 tokens x 2 reps, 1 thread)
step_engine_ab() {
  PYTHONPATH=src python $out/engine_ab.py --out $out/engine_ab.jsonl
}

# session 7: one LM-head call per layout and row count, 1 and 2 threads
step_head_layout() {
  PYTHONPATH=src python $out/linear_layout.py --threads 1 --matrices head --rows 1,2,3,4,6,8,16 --out $out/head_layout_1thread.json
  PYTHONPATH=src python $out/linear_layout.py --threads 2 --matrices head --rows 1,2,3,4,6,8,16 --out $out/head_layout_2threads.json
}

# session 4: the same over all 210 decoder matrices (eager)
step_linear_layout() {
  PYTHONPATH=src python $out/linear_layout.py --threads 2 --rows 1,2,3,4,5,8,16,32,64 --out $out/linear_layout.json
}

# session 3: tree-mask block counts, BFS vs DFS order (trees do not depend on timing; writes tree_blocks.json)
step_tree_blocks() {
  PYTHONPATH=src python $out/tree_blocks.py
}

# session 12: prose continuation with the instruct-tuned default draft against the previous (prose-only)
# default, each in its own process (one --draft per bench; compare ratios, not tok/s). 2 threads, idle.
step_prose_draft() {
  local S="autoregressive,hf-generate,linear:k=4,dynatree@model,dynatree:source=hybrid@hybrid" ds old
  old=$(mktemp -d)
  git show 74ff75c:src/dynatree/assets/drafts/smollm2-135m-distilled/config.json > "$old/config.json"
  git show 74ff75c:src/dynatree/assets/drafts/smollm2-135m-distilled/model.safetensors > "$old/model.safetensors"
  for ds in wiki-offline books-offline; do
    dynatree bench --dataset $ds --num-prompts 3 --max-prompt-tokens 256 --max-new-tokens 96 --warmup 1 --threads 2 \
      --no-progress --strategies "$S" --output $out/prose_draft.jsonl
    dynatree bench --dataset $ds --num-prompts 3 --max-prompt-tokens 256 --max-new-tokens 96 --warmup 1 --threads 2 \
      --no-progress --draft "$old" --strategies "$S" --output $out/prose_draft_previous.jsonl
  done
  rm -r "$old"
}

# session 13: what a verify pass costs against its rows, three variants of the CPU path (writes verify_rows.json)
step_verify_rows() {
  PYTHONPATH=src python $out/verify_rows.py --threads 2 --context 700 --out $out/verify_rows.json
}

# session 14: KV rows appended in place against HF's concatenation (tried, not shipped; writes kv_append.json)
step_kv_append() {
  PYTHONPATH=src python $out/kv_append.py --threads 2 --out $out/kv_append.json
}

# session 14: verify cost against rows with and without weights packed for oneDNN (writes packed_linear.json)
step_packed_linear() {
  PYTHONPATH=src python $out/packed_linear.py --threads 2 --context 700 --out $out/packed_linear.json
}

# issue 36 item 3: every strategy's two-token call against HF's generate (tiny pair; --real: the
# embedded pair too); appends one line per run to per_call.jsonl (--label names the code)
step_per_call() {
  PYTHONPATH=src python $out/per_call.py --threads 1 --reps 300 --out $out/per_call.jsonl
  PYTHONPATH=src python $out/per_call.py --threads 2 --reps 100 --out $out/per_call.jsonl
  PYTHONPATH=src python $out/per_call.py --threads 1 --reps 50 --real --real-reps 15 --out $out/per_call.jsonl
}

steps="engines early_exit t06 sweep sweep_history sweep_gates streaming lengths fast_default compile_cost engine_ab head_layout linear_layout tree_blocks prose_draft verify_rows kv_append packed_linear per_call"
for step in ${*:-$steps}; do
  if ! declare -F "step_$step" > /dev/null; then
    echo "unknown step '$step'; steps: $steps" >&2
    exit 2
  fi
  "step_$step"
done
