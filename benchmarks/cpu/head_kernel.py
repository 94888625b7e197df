"""The LM head on its own few-row kernel bands against the layers' bands: the head's kernels by
row count, then the default and the text alone on the aot engine with each.

    python benchmarks/cpu/head_kernel.py --out benchmarks/cpu/head_kernel.jsonl

Part 1: the embedded target's head weight alone, one call per kernel (``F.linear``, row-major,
oneDNN packed) and row count, interleaved, ``--reps`` rounds, median ms. Part 2: Spec-Bench first
turns (``--questions`` per task), ``--new`` tokens; on each prompt in turn both arms (the measured
plan with the head's own bands, and the same plan with the head on the layers' bands), the order
reversed from one prompt to the next, ``--passes`` passes; pooled tokens per second per pass. Both
arms read the same cost profile (the head arm's, as cached), so they build the same trees and only
the head's kernel differs; every output of both arms is compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

ROWS = (1, 2, 3, 4, 6, 8, 9, 12, 14, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import record_meta
    from dynatree.core import costmodel
    from dynatree.loading import models
    from dynatree.options import LinearPlan
    from dynatree.runtime.engines import resolve
    from dynatree.runtime.kernels.cpu_linear import small_batch_linear

    meta = record_meta(args.threads)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    head = target.get_output_embeddings().weight

    # 1. The head alone.
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.reps):
        for n in ROWS:
            x = torch.randn(n, head.shape[1])
            for kernel in ("linear", "rowmajor", "packed"):
                call = (lambda: torch.nn.functional.linear(x, head)) if kernel == "linear" \
                    else (lambda: small_batch_linear(x, head, None, kernel))
                call()
                t = time.perf_counter()
                call()
                times.setdefault((kernel, n), []).append(1e3 * (time.perf_counter() - t))
    head_ms = {k: {n: round(statistics.median(times[(k, n)]), 2) for n in ROWS} for k in ("linear", "rowmajor", "packed")}

    # 2. Decoding with each.
    plan = resolve(dynatree.EngineOptions(engine="aot"), target).linear_plan
    arms = {"head-bands": dynatree.EngineOptions(engine="aot", linear_plan=plan),
            "layers-bands": dynatree.EngineOptions(engine="aot", linear_plan=LinearPlan(plan.bands, plan.why))}
    real_load = costmodel.load

    def load(key: dict) -> costmodel.CostProfile | None:  # (both arms: the head arm's profile)
        if key.get("cpu_linear") == LinearPlan(plan.bands).kernels():
            key = {**key, "cpu_linear": plan.kernels()}
        return real_load(key)

    costmodel.load = load
    prompts = [ids for _, ids in specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)]
    modes = {"default": draft, "text": None}
    for options in arms.values():
        for d in modes.values():
            dynatree.generate(target, d, prompts[0], max_new_tokens=4, options=options)
    seconds = {(m, a): [0.0] * args.passes for m in modes for a in arms}
    tokens = {(m, a): [0] * args.passes for m in modes for a in arms}
    equal = total = 0
    for p in range(args.passes):
        for j, ids in enumerate(prompts):
            for mode, d in modes.items():
                outs = {}
                for name in (list(arms) if (p + j) % 2 == 0 else list(arms)[::-1]):
                    t = time.perf_counter()
                    out = dynatree.generate(target, d, ids, max_new_tokens=args.new, options=arms[name])
                    seconds[(mode, name)][p] += time.perf_counter() - t
                    tokens[(mode, name)][p] += out.sequences.shape[1] - len(ids)
                    outs[name] = out.sequences[0].tolist()
                equal += len({tuple(v) for v in outs.values()}) == 1
                total += 1
        print(p, {f"{m}/{a}": round(tokens[(m, a)][p] / seconds[(m, a)][p], 2) for m, a in seconds}, flush=True)
    rates = {f"{m}/{a}": [tokens[(m, a)][p] / seconds[(m, a)][p] for p in range(args.passes)] for m, a in seconds}
    record = {"prompts": len(prompts), "new_tokens": args.new, "passes": args.passes, "plan": plan.describe(),
              "head_ms": head_ms,
              "pooled_tokens_per_second": {k: round(statistics.median(v), 2) for k, v in rates.items()},
              "per_pass": {k: [round(x, 2) for x in v] for k, v in rates.items()},
              "head_over_layers": {m: [round(h / l, 3) for h, l in zip(rates[f"{m}/head-bands"], rates[f"{m}/layers-bands"])]
                                   for m in modes},
              "outputs_equal": f"{equal} of {total}", **meta}
    print(json.dumps(record))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
