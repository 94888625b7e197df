"""The aot engine's prefill: even chunks, each on a cache of exactly the columns it fills (today's
``AOTCachedModel.prefill``), against the policy it replaced: chunks of 256 and a tail, the cache
grown by an eighth (rounded up to 128 columns) as it fills, so that every chunk read masked columns.

    python benchmarks/cpu/aot_prefill_exact.py --out benchmarks/cpu/aot_prefill_exact.jsonl

The embedded target on its aot packages (built or loaded first), Spec-Bench first turns
(``--questions`` per task). Each prompt is prefilled under both policies in turn, the order
reversed from one prompt to the next, over ``--passes`` passes after a warm-up; per policy the
seconds summed over prompts and passes, and per prompt the median. Both policies' last logits are
compared (same argmax; their largest difference: other column counts, other float rounding).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import record_meta
    from dynatree.loading import models
    from dynatree.runtime import aot_engine
    from dynatree.runtime.cache import BucketedModel
    from dynatree.runtime.kernels import linear_plan

    meta = record_meta(args.threads)
    target, tok = models.load_model("smollm2-135m")
    prompts = [ids[:-1] for _, ids in specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)]
    kv = aot_engine.AOTCachedModel(target, target.config.vocab_size, 4096, cpu_linear=linear_plan.plan_for(target))

    def grown(ids: list[int]) -> torch.Tensor:  # (the replaced policy; its cache grows in ``_run``)
        step = max(kv.max_tree_rows, aot_engine.PREFILL_CHUNK)
        parts = [BucketedModel.prefill(kv, ids[i : i + step], False, (), i + step >= len(ids))
                 for i in range(0, len(ids), step)]
        return parts[-1]

    policies = {"grown": grown, "exact": lambda ids: kv.prefill(ids, logits=True)}

    def timed(name: str, ids: list[int]) -> tuple[float, torch.Tensor]:
        kv.reset()
        kv._allocate(aot_engine._FIRST_COLUMNS)  # (as a fresh engine starts)
        t = time.perf_counter()
        out = policies[name](ids)
        return time.perf_counter() - t, out

    for name in policies:  # (warm-up)
        timed(name, prompts[0])
    seconds = {name: [[] for _ in prompts] for name in policies}
    gaps, same = [], True
    for p in range(args.passes):
        for j, ids in enumerate(prompts):
            outs = {}
            for name in (list(policies) if (p + j) % 2 == 0 else list(policies)[::-1]):
                s, outs[name] = timed(name, ids)
                seconds[name][j].append(s)
            same &= int(outs["grown"].argmax()) == int(outs["exact"].argmax())
            gaps.append(float((outs["grown"] - outs["exact"]).abs().max()))
    total = {name: round(sum(map(sum, v)), 3) for name, v in seconds.items()}
    record = {"prompt_tokens": [len(p) for p in prompts], "passes": args.passes, "prefill_s": total,
              "ratio_of_sums": round(total["exact"] / total["grown"], 3),
              "median_s_per_prompt": {name: [round(statistics.median(v), 4) for v in per] for name, per in seconds.items()},
              "same_argmax": same, "max_logit_difference": max(gaps), **meta}
    print(json.dumps(record))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
