"""The aot engine's frozen package with the products of one input concatenated and serving from 3
rows, against the layout before (no concatenation, serving from where the plan packs): steps by
row count, prefills, then plain decoding and the default.

    python benchmarks/cpu/aot_concat_linear.py --out benchmarks/cpu/aot_concat_linear.jsonl

The two arms are the engine's settings (``aot_engine.FROZEN_INDUCTOR``, ``aot_engine.DYNAMIC_BY``),
each with its own packages and cost profile (built or measured on first use, and loaded at each
switch, outside the timing).
Part 1: the target alone at 150 cached tokens, each row count of ``ROWS`` timed ``--reps`` times a
round, and prefills of ``PREFILLS`` tokens, arms alternating round by round (``--rounds``), median
ms. Part 2: Spec-Bench first turns (``--questions`` per task), ``--new`` tokens, plain decoding and
the default; on each prompt in turn both arms, the order reversed from one prompt to the next,
``--passes`` passes; pooled tokens per second per pass; every output of both arms is compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
PREFILLS = (85, 256, 768)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import record_meta
    from dynatree.loading import models
    from dynatree.runtime import aot_engine
    from dynatree.runtime.engines import cached_target, resolve

    meta = record_meta(args.threads)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    options = dynatree.EngineOptions(engine="aot")
    arms = {"before": ({"freezing": True}, 1 << 30), "after": (aot_engine.FROZEN_INDUCTOR, aot_engine.DYNAMIC_BY)}

    def arm(name: str) -> None:
        """Switch to arm ``name``: its settings, its packages loaded (a short run of each mode)."""
        aot_engine.FROZEN_INDUCTOR, aot_engine.DYNAMIC_BY = arms[name]
        aot_engine.forget()
        for d in (None, draft):
            dynatree.generate(target, d, list(range(100, 140)), max_new_tokens=4, options=options)

    for name in arms:  # (packages built, cost profiles measured)
        arm(name)

    # 1. Steps and prefills.
    times: dict[tuple[str, str], list[float]] = {}
    layout = {}
    for r in range(args.rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            arm(name)
            with torch.inference_mode():
                kv = cached_target(target, target.config.vocab_size, resolve(options, target, tokens=8), 1024)
                layout[name] = {"buckets": list(kv.buckets), "dynamic_from": kv.build["dynamic_from"]}
                kv.prefill(list(range(100, 250)))
                for n in ROWS:
                    visible = torch.ones(n, n, dtype=torch.bool).tril()
                    for _ in range(args.reps):
                        t = time.perf_counter()
                        kv.forward(list(range(300, 300 + n)), torch.arange(150, 150 + n), visible, 150)
                        times.setdefault((name, f"rows {n}"), []).append(1e3 * (time.perf_counter() - t))
                        kv.compact(150, [])
                for n in PREFILLS:
                    kv = cached_target(target, target.config.vocab_size, resolve(options, target, tokens=8), n + 64)
                    t = time.perf_counter()
                    kv.prefill(list(range(100, 100 + n)), logits=True)
                    times.setdefault((name, f"prefill {n}"), []).append(1e3 * (time.perf_counter() - t))
    labels = [f"rows {n}" for n in ROWS] + [f"prefill {n}" for n in PREFILLS]
    step_ms = {name: {k: round(statistics.median(times[(name, k)]), 2) for k in labels} for name in arms}
    print(json.dumps(step_ms), flush=True)

    # 2. Decoding with each.
    prompts = [ids for _, ids in specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)]
    modes = {"plain": None, "default": draft}
    seconds = {(m, a): [0.0] * args.passes for m in modes for a in arms}
    tokens = {(m, a): [0] * args.passes for m in modes for a in arms}
    equal = total = 0
    for p in range(args.passes):
        for j, ids in enumerate(prompts):
            outs: dict[str, dict[str, list[int]]] = {m: {} for m in modes}
            for name in (list(arms) if (p + j) % 2 == 0 else list(arms)[::-1]):
                arm(name)
                for mode, d in modes.items():
                    strategy = "autoregressive" if d is None else "dynatree"
                    t = time.perf_counter()
                    out = dynatree.generate(target, d, ids, strategy, max_new_tokens=args.new, options=options)
                    seconds[(mode, name)][p] += time.perf_counter() - t
                    tokens[(mode, name)][p] += out.sequences.shape[1] - len(ids)
                    outs[mode][name] = out.sequences[0].tolist()
            for mode in modes:
                equal += len({tuple(v) for v in outs[mode].values()}) == 1
                total += 1
        print(p, {f"{m}/{a}": round(tokens[(m, a)][p] / seconds[(m, a)][p], 2) for m, a in seconds}, flush=True)
    rates = {f"{m}/{a}": [tokens[(m, a)][p] / seconds[(m, a)][p] for p in range(args.passes)] for m, a in seconds}
    record = {"prompts": len(prompts), "new_tokens": args.new, "passes": args.passes,
              "arms": {name: {"inductor": arms[name][0], **layout[name]} for name in arms},
              "step_ms_150_cached": step_ms,
              "pooled_tokens_per_second": {k: round(statistics.median(v), 2) for k, v in rates.items()},
              "per_pass": {k: [round(x, 2) for x in v] for k, v in rates.items()},
              "after_over_before": {m: [round(a / b, 3) for a, b in zip(rates[f"{m}/after"], rates[f"{m}/before"])]
                                    for m in modes},
              "outputs_equal": f"{equal} of {total}", **meta}
    print(json.dumps(record))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
