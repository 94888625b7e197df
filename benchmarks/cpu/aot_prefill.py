"""The aot engine's eager prefill chunks: ``F.linear`` against oneDNN's product on the weights in
place (``aot_engine.prefill_layout``), on the first prompt of each of 6 Spec-Bench tasks (40-769 tokens,
chunks of 256), interleaved prompt by prompt over 4 passes after a warm-up; the prefill seconds
each took (``stats.t_prefill``, the target alone), summed.

    python benchmarks/cpu/aot_prefill.py --out benchmarks/cpu/aot_prefill.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import record_meta
    from dynatree.runtime import aot_engine
    from dynatree.loading import models

    meta = record_meta(args.threads)  # (at the start: the code that runs)
    target, tok = models.load_model("smollm2-135m")
    prompts = [ids for _, ids in specbench_prompts("spec-bench", tok, 1, 2048, first_turns=True)[:6]]
    chosen = aot_engine.prefill_layout
    variants = {"F.linear": lambda plan, rows: aot_engine.few_row_layout(plan, rows), "prefill_layout": chosen}
    seconds = {v: [] for v in variants}
    for rep in range(args.passes + 1):
        for ids in prompts:
            for v, layout in variants.items():
                aot_engine.prefill_layout = layout
                out = dynatree.generate(target, None, ids, "autoregressive", max_new_tokens=1,
                                        options=dynatree.EngineOptions(engine="aot"))
                if rep:
                    seconds[v].append(out.stats.t_prefill)
    aot_engine.prefill_layout = chosen
    pairs = [b / a for a, b in zip(seconds["F.linear"], seconds["prefill_layout"])]
    line = {"prompt_tokens": [len(p) for p in prompts], "passes": args.passes,
            "prefill_s": {v: round(sum(s), 2) for v, s in seconds.items()},
            "ratio_of_sums": round(sum(seconds["prefill_layout"]) / sum(seconds["F.linear"]), 3),
            "median_pair_ratio": round(statistics.median(pairs), 3),
            **meta}
    print(json.dumps(line))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
