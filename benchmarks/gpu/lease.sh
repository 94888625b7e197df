#!/usr/bin/env bash
# One GPU lease, one command (at most 10 minutes): Spec-Bench and batches on the GPU against our
# compiled autoregressive decoding, and where a round's time goes. Stages, each under its own time
# limit, in order of worth:
#
#   1. end to end on Spec-Bench's questions (4 per task, MT-bench with both turns; they ship in the
#      package, so the prompts are the CPU run's on any Python), bfloat16, greedy, on the compiled
#      static engine (CUDA graphs): our compiled autoregressive decoding, the default (draft model +
#      text in one tree), the text alone and the draft model alone (`dynatree bench`);
#   2. the same in float32 (the bf16 rows' greedy match against fp32 greedy is computed from both);
#   3. batches of 1, 4, 16 and 64 Spec-Bench first turns, bfloat16: HF's batched generate (the
#      reference for the mismatch count), our batched autoregressive decoding, the text alone and
#      the default, peak GPU memory per row (benchmarks/batch/batch.py);
#   4. one default round's profile: draft calls, tree building, verify, accept, compaction,
#      Python (benchmarks/gpu/profile_round.py).
#
# After every stage the results are packed into --pack (files over 12 MB alone, the rest in
# results.tgz), so a command stopped at its limit still brings back what it made.
#
#   bash benchmarks/gpu/lease.sh --gguf FILE --out /tmp/lease --pack "$OUT"
#   bash benchmarks/gpu/lease.sh --gguf-parts DIR --out /tmp/lease --pack "$OUT"   # DIR/*.part* + *.sha256
#   bash benchmarks/gpu/lease.sh --smoke --out /tmp/lease-smoke --pack /tmp/lease-pack   # CPU rehearsal
set -u
cd "$(dirname "$0")/../.."

out=/tmp/lease
pack=""
gguf=""
parts=""
smoke=""
limit=570  # the whole command, seconds
while [ $# -gt 0 ]; do
  case "$1" in
    --gguf) gguf=$2; shift 2 ;;
    --gguf-parts) parts=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --pack) pack=$2; shift 2 ;;
    --smoke) smoke=--smoke; shift ;;
    --limit-s) limit=$2; shift 2 ;;
    *) echo "usage: bash benchmarks/gpu/lease.sh [--gguf FILE | --gguf-parts DIR] --out DIR [--pack DIR] [--smoke] [--limit-s S]" >&2; exit 2 ;;
  esac
done

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DYNATREE_CACHE="${DYNATREE_CACHE:-/tmp/dynatree-cache}"
py=${PYTHON:-python3}
start=$(date +%s)
if [ -z "$smoke" ] && ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dynatree-site .whl/*.whl || exit 2
fi
[ -d /tmp/dynatree-site ] && export PYTHONPATH="$PYTHONPATH:/tmp/dynatree-site"
if [ -n "$parts" ]; then  # the GGUF carried in parts (benchmarks/gpu/join_gguf.sh)
  . benchmarks/gpu/join_gguf.sh
  gguf=$(join_gguf_parts "$parts") || exit 2
fi
[ -n "$gguf" ] || [ -n "$smoke" ] || { echo "--gguf FILE or --gguf-parts DIR is required on the GPU (or --smoke)" >&2; exit 2; }

left() { echo $(( limit - ($(date +%s) - start) )); }
mkdir -p "$out"

packup() {  # the results so far into $pack: big files alone, the rest in one archive
  [ -n "$pack" ] || return 0
  mkdir -p "$pack"
  local big
  big=$(find "$out" -type f -size +12M)
  for f in $big; do cp "$f" "$pack/$(echo "${f#"$out"/}" | tr / _)"; done
  tar -czf "$pack/results.tgz" -C "$out" $(cd "$out" && find . -type f -size -12M) 2>/dev/null
}
stage() {  # stage NAME MAX_S command...: at most MAX_S seconds, never past the command's limit
  local name=$1 max=$2; shift 2
  local budget
  budget=$(left); budget=$(( budget - 15 ))
  [ "$budget" -lt "$max" ] && max=$budget
  if [ "$max" -lt 30 ]; then echo "== $name skipped: ${max}s left" | tee -a "$out/stages.log"; return; fi
  echo "== $name (at most ${max}s; $(( $(date +%s) - start ))s so far)" | tee -a "$out/stages.log"
  timeout --signal=INT --kill-after=10 "$max" "$@" > "$out/$name.log" 2>&1
  echo "== $name ended with status $? after $(( $(date +%s) - start ))s" | tee -a "$out/stages.log"
  tail -4 "$out/$name.log"
  packup
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $py -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
  git log -1 --format='code %H' 2>/dev/null; git status --short 2>/dev/null | head -5
  nproc; free -g | head -2; } > "$out/env.txt" 2>&1
cat "$out/env.txt"

if [ -n "$smoke" ]; then
  target=smollm2-135m; dev=cpu; dtypes=(float32 float32); c="engine=static"
  e2e=(--num-prompts 1 --max-prompt-tokens 2048 --max-new-tokens 8 --warmup 0 --buckets 1,16,64)
  batch=(--batch-sizes 1,2 --max-new-tokens 6 --tasks mt_bench)
  profile=(--per-task 1 --max-new-tokens 8 --no-compile)
else
  target=$gguf; dev=cuda; dtypes=(bfloat16 float32); c="engine=static:compile=true"
  e2e=(--num-prompts 4 --max-prompt-tokens 2048 --max-new-tokens 64 --warmup 1 --warmup-tokens 8 --buckets 1,16,64)
  batch=(--batch-sizes 1,4,16,64 --max-new-tokens 64 --tasks mt_bench,translation,qa)
  profile=(--per-task 1 --max-new-tokens 96)
  # the GGUF's fp32 conversion, once, outside the timed stages' limits
  $py -c "from dynatree.loading.models import load_model; load_model('$gguf')" > "$out/convert.log" 2>&1 || { tail "$out/convert.log"; exit 2; }
fi
specs="autoregressive:$c@ar-compiled,dynatree:source=hybrid:$c@default-compiled,dynatree:source=text:$c@text-compiled,dynatree:source=model:$c@model-compiled"

# 1 and 2. end to end against compiled AR, bf16 then fp32 (each dtype its own run group and file)
stage e2e-1-${dtypes[0]} 165 $py -m dynatree bench --target "$target" --dataset spec-bench --device "$dev" --dtype "${dtypes[0]}" \
  "${e2e[@]}" --strategies "$specs" --output "$out/e2e-1-${dtypes[0]}.jsonl" --overwrite --no-progress
stage e2e-2-${dtypes[1]} 150 $py -m dynatree bench --target "$target" --dataset spec-bench --device "$dev" --dtype "${dtypes[1]}" \
  "${e2e[@]}" --strategies "$specs" --output "$out/e2e-2-${dtypes[1]}.jsonl" --overwrite --no-progress
# 3. batches (the HF engine: batches run on the dynamic cache)
stage batch 110 $py benchmarks/batch/batch.py --target "$target" --device "$dev" --dtype "${dtypes[0]}" --threads 8 \
  --dataset spec-bench --variants hf,ar,text,hybrid "${batch[@]}" --out "$out/batch.jsonl" --label lease
# 4. where one default round's time goes
stage profile 70 $py benchmarks/gpu/profile_round.py --target "$target" --device "$dev" --dtype "${dtypes[0]}" \
  "${profile[@]}" --out "$out/profile"
echo "== lease.sh done after $(( $(date +%s) - start ))s" | tee -a "$out/stages.log"
packup
ls -l "$out" ${pack:+"$pack"}
