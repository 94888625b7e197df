"""A linear layer's product by weight layout, shape by shape (issue 55: where a step's time goes).

    python benchmarks/cpu/kernels/weight_layout.py --out benchmarks/cpu/kernels/weight_layout.json

For each weight shape of a model (``--model``: the embedded SmolLM2-135M's, or a Qwen2.5-1.5B's),
the product of ``rows`` input rows with the weight, timed three ways:

- ``linear``: ``F.linear(x, W)`` on the weight as HF stores it (``[out, in]``), what HF and our
  engines run today (the aot packages' ``mm`` too);
- ``transposed``: ``x @ Wt`` on a contiguous copy stored ``[in, out]`` (BLAS without the transposed
  operand);
- ``packed``: oneDNN's product on its packed copy (what the aot engine's frozen package holds).

Enough copies of each weight are cycled that every call reads memory, as a step does (past any
CPU's last-level cache); the layouts are interleaved, 5 rounds, median per call. Cost does not
depend on the values, so the weights are random.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

SHAPES = {  # (out, in) of each linear weight of a decoder layer, then the LM head
    "smollm2-135m": [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)],
    "qwen2.5-1.5b": [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960), (151936, 1536)],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), nargs="+", default=sorted(SHAPES))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 40, 256])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cycle-mb", type=float, default=400.0, help="bytes of copies cycled per shape")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dynatree.bench.sysinfo import machine_info, provenance

    records = []
    for model in args.model:
        for out_f, in_f in SHAPES[model]:
            n = max(1, int(args.cycle_mb * 2**20 // (out_f * in_f * 4)))
            weights = [torch.randn(out_f, in_f) for _ in range(n)]
            layouts = {"linear": weights, "transposed": [w.t().contiguous() for w in weights],
                       "packed": [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]}
            for rows in args.rows:
                x = torch.randn(rows, in_f)
                calls = {
                    "linear": lambda w: torch.nn.functional.linear(x, w),
                    "transposed": lambda w: torch.mm(x, w),
                    "packed": lambda w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
                }
                times: dict[str, list[float]] = {k: [] for k in calls}
                for _ in range(5):
                    for k, f in calls.items():
                        t = time.perf_counter()
                        for w in layouts[k]:
                            f(w)
                        times[k].append((time.perf_counter() - t) / n)
                med = {k: statistics.median(v) for k, v in times.items()}
                rec = {"model": model, "shape": [out_f, in_f], "rows": rows,
                       "us": {k: round(v * 1e6, 1) for k, v in med.items()},
                       "gb_per_s": {k: round(out_f * in_f * 4 / v / 1e9, 1) for k, v in med.items()}}
                records.append(rec)
                print(json.dumps(rec), flush=True)
            del weights, layouts
    args.out.write_text(json.dumps({"machine": machine_info(), "code": provenance().get("code"),
                                    "torch": torch.__version__, "threads": args.threads,
                                    "date": time.strftime("%Y-%m-%d"), "records": records}, indent=1))


if __name__ == "__main__":
    main()
