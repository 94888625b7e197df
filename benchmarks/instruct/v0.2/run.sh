#!/bin/bash
# The instruct sets at 306278f (issue 38's reference commit) and at this checkout, alternately, on one
# machine: bash benchmarks/instruct/v0.2/run.sh PASS (from the repository root; needs `git worktree`).
# Both run from this checkout's venv; PYTHONPATH picks which source tree `python -m dynatree` imports.
set -eu
cd "$(dirname "$0")/../../.."
pass=${1:-1}
[ -d /tmp/dynatree-306278f ] || git worktree add -f /tmp/dynatree-306278f 306278f
for v in old new; do
  if [ "$v" = old ]; then src=/tmp/dynatree-306278f/src; else src=$PWD/src; fi
  PYTHONPATH=$src python -m dynatree bench --dataset instruct --num-prompts 12 --max-prompt-tokens 1024 \
    --max-new-tokens 192 --threads 2 --warmup 1 --no-progress \
    --strategies "autoregressive,dynatree:source=hybrid@hybrid,dynatree:source=text@text" \
    --output "benchmarks/instruct/v0.2/$v-$pass.jsonl"
done
