#!/usr/bin/env bash
# Our decoding against OpenVINO GenAI's on the same CPU, same prompts, exact fp32, interleaved (README.md).
#   bash benchmarks/cpu/openvino/run.sh OUT.json [compare.py flags, e.g. --questions 4]
#   (from the repository root, our venv active)
set -eu
out=${1:-benchmarks/cpu/openvino/result.json}
shift || true
dir=${OV_DIR:-/tmp/ov}
python benchmarks/cpu/openvino/compare.py --dir "$dir" --prepare
if [ ! -x "$dir/venv/bin/python" ]; then
  python -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q torch==2.13.0   # (a CPU build first: optimum would pull a CUDA one)
  "$dir/venv/bin/pip" install -q openvino-genai "optimum-intel[openvino]"
fi
[ -f "$dir/ir/openvino_model.xml" ] || "$dir/venv/bin/optimum-cli" export openvino --model "$dir/hf" \
  --weight-format fp32 --task text-generation-with-past "$dir/ir"
python benchmarks/cpu/openvino/compare.py --dir "$dir" --ov-python "$dir/venv/bin/python" --out "$out" "$@"
