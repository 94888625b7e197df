#!/usr/bin/env bash
# Instruct data labelled by the target on a GPU, and a distilled draft trained on it (independent, or
# `--kind feature --feature-layers auto` for the feature head with EAGLE-3's fused layers), in one
# command of at most 9 minutes, without network (see gpu_instruct.py for the steps).
#
#   bash benchmarks/distill/gpu_instruct.sh --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR
#   bash benchmarks/distill/gpu_instruct.sh --gguf-parts DIR --out DIR   # DIR/*.part* + *.sha256, joined here
#   bash benchmarks/distill/gpu_instruct.sh --out DIR                    # GGUF from $DYNATREE_CACHE/gguf-path
#   bash benchmarks/distill/gpu_instruct.sh --smoke --out /tmp/smoke     # CPU, tiny random target (the tests)
#
# Any other flag goes to gpu_instruct.py (--train-sequences, --steps, --gen-batch, --budget-s, ...).
# DIR gets draft/ (config.json, metrics.json, fp16 weights in files under 16 MB: join them with
# `python benchmarks/distill/gpu_instruct.py --join DIR/draft`), metrics.json and train_log.jsonl.
set -u
cd "$(dirname "$0")/../.."

out=""
gguf=""
parts=""
smoke=""
limit=560
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gguf) gguf=$2; shift 2 ;;
    --gguf-parts) parts=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --smoke) smoke=--smoke; shift ;;
    --limit-s) limit=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: bash benchmarks/distill/gpu_instruct.sh [--gguf FILE | --gguf-parts DIR] --out DIR [--smoke] [gpu_instruct.py flags]" >&2; exit 2; }

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1                  # nothing is downloaded
export DYNATREE_CACHE="${DYNATREE_CACHE:-/tmp/dynatree-cache}"  # the converted target lives here
py=${PYTHON:-python3}

# Python packages the machine lacks travel as wheels in .whl/ (benchmarks/gpu/README.md: gguf).
if [ -z "$smoke" ] && ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dynatree-site .whl/*.whl || exit 2
fi
[ -d /tmp/dynatree-site ] && export PYTHONPATH="$PYTHONPATH:/tmp/dynatree-site"

if [ -n "$parts" ]; then  # the GGUF carried in parts (benchmarks/gpu/join_gguf.sh)
  . benchmarks/gpu/join_gguf.sh
  gguf=$(join_gguf_parts "$parts") || exit 2
fi
if [ -z "$gguf" ] && [ -z "$smoke" ] && [ -f "$DYNATREE_CACHE/gguf-path" ]; then  # joined by an earlier command
  gguf=$(cat "$DYNATREE_CACHE/gguf-path")
fi
if [ -n "$gguf" ]; then
  mkdir -p "$DYNATREE_CACHE" && realpath "$gguf" > "$DYNATREE_CACHE/gguf-path"
  pass+=(--gguf "$gguf")
fi

mkdir -p "$out"
start=$(date +%s)
# SIGINT first: Python unwinds (partial labels and checkpoints are already on disk), then KILL
timeout --signal=INT --kill-after=15 "$limit" $py benchmarks/distill/gpu_instruct.py $smoke --out "$out" "${pass[@]}" 2>&1 | tee "$out/run.log"
rc=${PIPESTATUS[0]}
echo "== gpu_instruct.sh: status $rc after $(( $(date +%s) - start ))s; results in $out" >&2
ls -l "$out" "$out/draft" >&2 2>/dev/null
exit "$rc"
