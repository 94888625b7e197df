"""Where a round's time goes, on the eager engine and on the aot engine (issue 55, item 4).

    python benchmarks/cpu/aot_round_profile.py --out benchmarks/cpu/aot_round_profile.jsonl

For each engine, our autoregressive decoding and the text draft alone decode Spec-Bench's first
turns (the first question of each task, 192 tokens, fp32, 2 threads) under cProfile, after one
warm-up run each. The time after the prompt's prefill is split, per round, into the target's calls
(the aot packages' steps, or the eager model calls, with the LM head where a call runs it), the LM
head applied apart to the rows acceptance reads, and the rest: tree building, the suffix index,
verification, KV compaction and Python. cProfile's own overhead
falls mostly on the rest (many small calls), so that share is an upper bound.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=192)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import record_meta
    from dynatree.loading import models

    meta = record_meta(args.threads)  # (at the start: the code that runs)
    target, tok = models.load_model("smollm2-135m")
    prompts = specbench_prompts("spec-bench", tok, 1, 2048, first_turns=True)
    for engine in ("hf", "aot"):
        for text in (False, True):
            options = dynatree.EngineOptions(engine=engine)
            strategy = "dynatree" if text else "autoregressive"
            dynatree.generate(target, None, prompts[0][1], strategy, text=text, max_new_tokens=16, options=options)
            prof, rounds, tokens, wall = cProfile.Profile(), 0, 0, 0.0
            for _, ids in prompts:
                prof.enable()
                t0 = time.perf_counter()
                out = dynatree.generate(target, None, ids, strategy, text=text, max_new_tokens=args.new, options=options)
                wall += time.perf_counter() - t0
                prof.disable()
                rounds += len(out.stats.rounds)
                tokens += out.sequences.shape[1] - len(ids)
            stats = pstats.Stats(prof)

            def cum(file: str, name: str) -> float:  # (the largest: an outer call holds its nested ones)
                return max([v[3] for k, v in stats.stats.items() if k[0].endswith(file) and k[2] == name] or [0.0])

            prefill = max(cum("runtime/cache.py", "prefill"), cum("runtime/aot_engine.py", "prefill"))
            # every call of the target: the aot engine's steps, or the eager engine's model calls
            calls = cum("runtime/aot_engine.py", "_run") if engine == "aot" else cum("runtime/cache.py", "call")
            head = cum("runtime/cache.py", "apply_head")
            forward = calls - prefill
            row = {"engine": engine, "draft": "text" if text else "none", "prompts": len(prompts), "tokens": tokens,
                   "rounds": rounds, "tok_per_s": round(tokens / wall, 1), "ms_per_round": round(1e3 * (wall - prefill) / rounds, 2),
                   "forward_ms_per_round": round(1e3 * forward / rounds, 2),
                   "head_ms_per_round": round(1e3 * head / rounds, 2),
                   "prefill_s": round(prefill, 2),
                   "rest_ms_per_round": round(1e3 * (wall - prefill - forward - head) / rounds, 2),
                   **meta}
            print(json.dumps({k: v for k, v in row.items() if k != "machine"}), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
