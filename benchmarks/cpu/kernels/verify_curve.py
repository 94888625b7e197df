"""Verify cost by rows against the memory-bandwidth floor, per few-row linear plan (issue 54).

    python benchmarks/cpu/kernels/verify_curve.py --shape qwen2.5-1.5b [--dtype float32] --out curves.jsonl
    python benchmarks/cpu/kernels/verify_curve.py --target smollm2-135m --out curves.jsonl
    python benchmarks/cpu/kernels/verify_curve.py --plot curves.jsonl --png curves.png

A verify call of ``n`` rows reads every weight of the target once, whatever ``n``: on a CPU whose
cores finish the arithmetic of a few rows within that read, its floor is one pass over the
weights, and so is a plain step's. What each linear plan does to that curve is measured here in one
process, interleaved:

- ``F.linear``: every call on ``F.linear`` (HF's own path; ``DYNATREE_LINEAR_PLAN=off``);
- ``previous``: the plan this project measured before oneDNN's kernels joined (``F.linear`` or the
  row-major layout per row count, packed weights only for models of at most 2 GiB);
- ``measured``: the plan measured now, from every kernel this machine and model allow
  (:func:`dynatree.runtime.kernels.linear_plan.plan_for`).

For each: the verify-cost curve (``costmodel.measure``: chains of 1-32 rows after 64 cached tokens,
hf engine, lazy head, median of 5 interleaved calls), and one pass of the plan's kernels over the
model's linear weights alone. The floor: the model's bytes over this machine's read bandwidth
(the fastest of a few full reads of every weight, ``Tensor.sum``). ``--shape`` builds a model of a
named shape with random weights (``dynatree.bench.shapes``: cost does not depend on their values).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROWS = (1, 2, 4, 8, 16, 32)


def previous_plan(model: torch.nn.Module):
    """The plan the previous code would have measured: F.linear or row-major per row count, packed
    weights only for fp32 models of at most 2 GiB."""
    from dynatree.runtime.kernels import linear_plan

    size = sum(p.numel() * p.element_size() for p in model.parameters())
    packing = next(model.parameters()).dtype == torch.float32 and size <= 2 * 1024**3
    kernels = ("linear", "rowmajor", "packed") if packing else ("linear", "rowmajor")
    weights = linear_plan.linear_weights(model, linear_plan.MEASURE_BYTES)
    return linear_plan.choose(linear_plan.measure(weights, kernels), why="previous kernels, measured now")


def linear_pass_ms(weights: list[torch.Tensor], plan, rows: int, reps: int = 3) -> float:
    from dynatree.runtime.kernels.cpu_linear import small_batch_linear

    g = torch.Generator().manual_seed(0)
    kernel = plan.kernel(rows) if plan is not None else "linear"
    xs = [torch.randn(rows, w.shape[1], generator=g).to(w.dtype) for w in weights]
    times = []
    with torch.inference_mode():
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            for x, w in zip(xs, weights):
                torch.nn.functional.linear(x, w) if kernel == "linear" else small_batch_linear(x, w, None, kernel)
            if rep:
                times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from dynatree.bench.shapes import SHAPES

    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--target", help="a preset or model folder instead of --shape")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--plans", default="F.linear,previous,measured")
    ap.add_argument("--out")
    ap.add_argument("--plot", help="a curves.jsonl to plot instead of measuring")
    ap.add_argument("--png")
    ap.add_argument("--table", help="a curves.jsonl to print as the README's markdown table")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot, args.png or str(Path(args.plot).with_suffix(".png")))
        return
    if args.table:
        print(table(args.table))
        return
    from dynatree.bench.costs import read_floor_ms
    from dynatree.bench.shapes import random_model
    from dynatree.bench.sysinfo import provenance
    from dynatree.core import costmodel
    from dynatree.loading.models import load_model, parse_dtype
    from dynatree.options import LinearPlan
    from dynatree.runtime.cache import CachedModel, vocab_size
    from dynatree.runtime.kernels import cpu_linear, linear_plan

    torch.set_num_threads(args.threads)
    dtype = parse_dtype(args.dtype)
    t0 = time.perf_counter()
    model = random_model(args.shape, dtype) if args.shape else load_model(args.target, dtype=dtype)[0].eval()
    name = args.shape or args.target
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, {args.dtype}, "
          f"built in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    weights = linear_plan.linear_weights(model)
    floor_ms, gbps = read_floor_ms(weights)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"floor: {floor_ms:.1f} ms per pass over the linear weights ({gbps:.1f} GB/s)", file=sys.stderr)
    plans: dict[str, LinearPlan | None] = {}
    for which in args.plans.split(","):
        if which == "F.linear":
            plans[which] = None
        elif which == "previous":
            plans[which] = previous_plan(model)
        else:
            t1 = time.perf_counter()
            plans[which] = linear_plan.plan_for(model)
            print(f"measured plan ({time.perf_counter() - t1:.1f} s): {plans[which].describe()}", file=sys.stderr)
        if plans[which] is not None and plans[which].packs and not cpu_linear.packing_applies(model):
            plans[which] = plans[which].without_packing()
    kvs = {k: CachedModel(model, vocab_size(model), cpu_linear=p or False) for k, p in plans.items()}
    curves: dict[str, list[list[float]]] = {k: [] for k in plans}
    with torch.inference_mode():
        for rep in range(args.reps):  # interleaved: a load change hits every plan alike
            for k, kv in kvs.items():
                prof = costmodel.measure(kv, ROWS, lazy_head=kv.supports_lazy_head(), reps=1)
                curves[k].append(list(prof.ms))
            print(f"rep {rep + 1}/{args.reps}: " + "  ".join(
                f"{k} " + "/".join(f"{m:.0f}" for m in curves[k][-1]) for k in kvs), file=sys.stderr)
    meta = {"model": name, "dtype": args.dtype, "threads": args.threads, "params": sum(p.numel() for p in model.parameters()),
            "model_bytes": model_bytes, "linear_bytes": sum(w.nbytes for w in weights),
            "floor_ms": floor_ms, "read_gb_per_s": gbps, "rows": list(ROWS), "context": costmodel.CONTEXT,
            "date": time.strftime("%Y-%m-%d"), **provenance()}
    rows_out = []
    for k, plan in plans.items():
        ms = [statistics.median(c[i] for c in curves[k]) for i in range(len(ROWS))]
        lin = [linear_pass_ms(weights, plan, r) for r in ROWS]
        row = {**meta, "plan": k, "bands": [list(b) for b in plan.bands] if plan else [],
               "describe": plan.describe() if plan else "F.linear everywhere",
               "verify_ms": ms, "verify_ratio": [m / ms[0] for m in ms], "linear_ms": lin,
               "linear_over_floor": [m / floor_ms for m in lin], "verify_over_floor": [m / floor_ms for m in ms]}
        rows_out.append(row)
        print(f"{k:9s} verify ms {'/'.join(f'{m:.0f}' for m in ms)}  x one row "
              f"{'/'.join(f'{m / ms[0]:.2f}' for m in ms)}  linear/floor {'/'.join(f'{m / floor_ms:.2f}' for m in lin)}")
    if args.out:
        with open(args.out, "a") as f:
            for row in rows_out:
                f.write(json.dumps(row, default=str) + "\n")


PLAN_NAMES = {"F.linear": "F.linear (HF's path)", "previous": "before oneDNN's kernels", "measured": "measured plan (the default)"}


def table(path: str) -> str:
    """The README's table: per model and plan, the one-row verify in ms, every other row count as a
    ratio to it, and the floor (one read of the linear weights) in ms."""
    rows = [json.loads(line) for line in open(path)]
    sizes = rows[0]["rows"]
    out = ["| model | kernels | 1 row (ms) | " + " | ".join(f"{n} rows" for n in sizes[1:]) + " | weights read once (ms) |",
           "|---" * (len(sizes) + 3) + "|"]
    for r in rows:
        ms = r["verify_ms"]
        out.append(f"| {r['model']} {r['dtype']} | {PLAN_NAMES.get(r['plan'], r['plan'])} | {ms[0]:.0f} | "
                   + " | ".join(f"{m / ms[0]:.2f}x" for m in ms[1:]) + f" | {r['floor_ms']:.0f} |")
    return "\n".join(out)


def plot(path: str, png: str) -> None:
    """One panel per model: verify ms by rows for each plan, the floor as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(path)]
    models = list(dict.fromkeys((r["model"], r["dtype"]) for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, (model, dtype) in zip(axes[0], models):
        mine = [r for r in rows if (r["model"], r["dtype"]) == (model, dtype)]
        for r in mine:
            ax.plot(r["rows"], r["verify_ms"], marker="o", label=f"{r['plan']}: {r['describe'][:40]}")
        floor = mine[-1]["floor_ms"]
        ax.axhline(floor, color="grey", ls="--", label=f"read every linear weight once ({floor:.0f} ms)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(mine[-1]["rows"], [str(x) for x in mine[-1]["rows"]])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("rows verified (root included)")
        ax.set_ylabel("ms per verify call")
        ax.set_title(f"{model} {dtype}, {mine[-1]['threads']} threads")
        ax.legend(fontsize=7)
    cpu = rows[-1].get("machine", {})
    fig.suptitle(f"verify cost vs rows: {cpu.get('cpu', '') if isinstance(cpu, dict) else cpu}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(png)


if __name__ == "__main__":
    main()
