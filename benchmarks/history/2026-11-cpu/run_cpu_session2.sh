#!/usr/bin/env bash
# CPU benchmarks on the offline pair (SmolLM2-135M target). Recorded in benchmarks/history/cpu-log.md.
# A record: this was benchmarks/cpu/run_cpu.sh in sessions 2-3 (step 6 was added in session 3) and
# writes to benchmarks/cpu/ as it did then. Of its files main.jsonl, static.jsonl,
# static_compiled.jsonl and sweep_history.jsonl are now in benchmarks/history/2026-11-cpu/; the
# commands of the current files are in benchmarks/cpu/run_cpu.sh (see benchmarks/cpu/RESULTS.md).
set -u
out=benchmarks/cpu
common="--dataset licenses --max-prompt-tokens 128 --threads 2 --no-progress"
SPEC="autoregressive,linear:k=3,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu,dynatree,dyspec:max_nodes=16@dyspec-16,dyspec-threshold:threshold=0.05:max_nodes=32@dyspec-thr"

# 1. every strategy, greedy, the shipped distilled draft (default). main_fullhead.jsonl (beside this script) is the same
#    command run before commit 031a0b1 (no lazy LM head yet) and the swept DynaTree defaults.
dynatree bench --strategies "$SPEC" --num-prompts 6 --max-new-tokens 96 --warmup 1 $common --output $out/main.jsonl
# 2. the other draft kind: untrained early exit (first 8 target layers, shared weights)
dynatree bench --draft early-exit:8 --strategies "autoregressive,linear:k=3,dynatree" --num-prompts 3 --max-new-tokens 48 --warmup 1 $common --output $out/early_exit.jsonl
# 3. sampling at T = 0.6 (acceptance of fixed tree vs DynaTree vs DySpec)
dynatree bench --temperature 0.6 --strategies "autoregressive,fixed:depth=3:branch=2:max_nodes=16@fixed-cpu,dynatree,dyspec:max_nodes=16@dyspec-16,dyspec-threshold:threshold=0.05:max_nodes=32@dyspec-thr" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/t06.jsonl
# 4. sweep of the DynaTree values the papers never give
dynatree sweep --strategy dynatree --grid max_nodes=4,8,16,32 --grid rho_deep=0.2,0.5 --grid tau=0.02,0.1 --baselines autoregressive --num-prompts 3 --max-new-tokens 64 --warmup 1 $common --output $out/sweep.jsonl
# 5. static engine, eager and compiled (compilation happens in the unrecorded warm-up run)
dynatree bench --engine static --strategies "autoregressive,linear:k=3,dynatree" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/static.jsonl
timeout 900 dynatree bench --engine static --compile --strategies "autoregressive,linear:k=3,dynatree" --num-prompts 4 --max-new-tokens 96 --warmup 1 $common --output $out/static_compiled.jsonl
# 6. history sweep (session 3): W x a*, then the gates B_mid x rho_stop x eta_D
dynatree sweep --strategy dynatree --grid window=4,8,16 --grid target_accept=0.25,0.35,0.5 --baselines autoregressive --num-prompts 4 --max-new-tokens 64 --warmup 1 $common --output $out/sweep_history.jsonl
dynatree sweep --strategy dynatree --grid rho_stop=0.02,0.05,0.1 --grid b_mid=1,2 --grid eta_d=1,2,4 --baselines autoregressive --num-prompts 4 --max-new-tokens 64 --warmup 1 $common --output $out/sweep_gates.jsonl
# (sessions 3-5 ran their own scripts, run_cpu_session3.sh to run_cpu_session5.sh beside this one: see ../INDEX.md)
