"""OpenVINO GenAI's side of ``compare.py``, run in its own virtual environment: reads one request a
line on stdin (``{"mode": "plain" | "prompt-lookup", "ids": [...], "new": N}``), decodes the prompt
greedily to exactly N new tokens with ``LLMPipeline`` in fp32 (f32 inference precision and KV cache;
its CPU defaults would use bf16 where the CPU has it, and a u8 KV cache), prompt lookup with 5 draft
tokens and 3-gram matches, and answers one line: the tokens and the seconds ``generate`` took.

Each request is decoded from scratch, as ours are. On a CPU, ``LLMPipeline`` runs on its
continuous-batching backend with a scheduler that keeps earlier requests' KV blocks and reuses them
for a prompt that starts the same way (``enable_prefix_caching``, on in its latency-oriented
default): a second turn asked right after its first turn, or a prompt timed again right after a
one-token run of it, would skip most of its prefill. So the worker passes that default scheduler
with prefix caching off (unlimited tokens per batch, as the default: one prefill, not 256-token
chunks); ``--prefix-caching`` keeps it on, as a chat application would.

    python openvino_worker.py --ir /tmp/ov/ir --threads 2   # (started by compare.py)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import openvino as ov
import openvino_genai as ov_genai


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ir", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix-caching", action="store_true", help="reuse earlier requests' KV (OpenVINO's default)")
    args = ap.parse_args()
    props = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "INFERENCE_NUM_THREADS": args.threads}
    scheduler = ov_genai.SchedulerConfig()  # (its own defaults differ from the pipeline's: set both fields)
    scheduler.max_num_batched_tokens = sys.maxsize  # (the pipeline's default: a prompt's prefill in one call)
    scheduler.enable_prefix_caching = args.prefix_caching
    pipes = {"plain": ov_genai.LLMPipeline(args.ir, "CPU", scheduler_config=scheduler, **props),
             "prompt-lookup": ov_genai.LLMPipeline(args.ir, "CPU", prompt_lookup=True, scheduler_config=scheduler,
                                                   **props)}
    settings = {**props, "enable_prefix_caching": args.prefix_caching, "max_num_batched_tokens": "unlimited"}
    print(json.dumps({"ready": True, "openvino": ov.get_version(), "settings": settings}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        cfg = ov_genai.GenerationConfig()
        cfg.max_new_tokens, cfg.do_sample = req["new"], False
        if req["mode"] == "prompt-lookup":
            cfg.num_assistant_tokens, cfg.max_ngram_size = 5, 3
        ids = np.array([req["ids"]], dtype=np.int64)
        t0 = time.perf_counter()
        res = pipes[req["mode"]].generate(ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), cfg)
        seconds = time.perf_counter() - t0
        tokens = [int(t) for t in np.array(res.tokens[0]).ravel()]
        print(json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
