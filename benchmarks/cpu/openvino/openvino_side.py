"""OpenVINO GenAI's side of the comparison, run in its own virtual environment (see README.md):
plain greedy decoding and its prompt lookup (5 draft tokens, 3-gram match) in fp32 (f32 inference
precision and KV cache), on the prompts ``ours.py`` wrote, each to HF greedy's own length; 3
passes, the first a warm-up; checks every output against HF greedy's.

    python benchmarks/cpu/openvino/openvino_side.py --dir /tmp/ov --out benchmarks/cpu/openvino/amd-epyc.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as ov_genai


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ov"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    data = json.loads((args.dir / "prompts.json").read_text())
    props = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "INFERENCE_NUM_THREADS": args.threads}

    def inputs(ids: list[int]) -> ov_genai.TokenizedInputs:
        a = np.array([ids], dtype=np.int64)
        return ov_genai.TokenizedInputs(ov.Tensor(a), ov.Tensor(np.ones_like(a)))

    rates: dict[str, float] = {}
    pooled: dict[str, float] = {}
    equal: dict[str, str] = {}
    for mode in ("plain", "prompt-lookup"):
        lookup = mode == "prompt-lookup"
        pipe = ov_genai.LLMPipeline(str(args.dir / "ir"), "CPU", **({"prompt_lookup": True} if lookup else {}), **props)
        got, same, tokens, seconds = [], 0, 0, 0.0
        for rep in range(3):
            for pid, ids in data["prompts"]:
                ref = data["refs"][pid]
                cfg = ov_genai.GenerationConfig()
                cfg.max_new_tokens, cfg.do_sample = len(ref), False
                if lookup:
                    cfg.num_assistant_tokens, cfg.max_ngram_size = 5, 3
                t0 = time.perf_counter()
                res = pipe.generate(inputs(ids), cfg)
                dt = time.perf_counter() - t0
                toks = [int(t) for t in np.array(res.tokens[0]).ravel()]
                if rep:
                    got.append(len(toks) / dt)
                    tokens, seconds = tokens + len(toks), seconds + dt
                    same += toks == ref
        rates[f"openvino-{mode}"] = round(statistics.mean(got), 1)
        pooled[f"openvino-{mode}"] = round(tokens / seconds, 1)
        equal[f"openvino-{mode}"] = f"{same} of {len(got)}"
        print(mode, rates[f"openvino-{mode}"], "tok/s; equal to HF greedy:", equal[f"openvino-{mode}"], flush=True)
    ours = json.loads((args.dir / "ours.json").read_text())
    result = {**ours, "openvino": ov.get_version(), "openvino_settings": props,
              "tokens_per_second": {**ours["tokens_per_second"], **rates},
              "pooled_tokens_per_second": {**ours.get("pooled_tokens_per_second", {}), **pooled},
              "openvino_equal_to_hf": equal,
              "python": platform.python_version()}
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
