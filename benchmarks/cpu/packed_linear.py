"""What one verify pass of the embedded target costs against its rows, with the few-row layout's
weights packed for oneDNN from ``CPU_PACKED_MIN_ROWS`` rows (the default) and without (the
row-major layout for every row count), interleaved in one process.

    python benchmarks/cpu/packed_linear.py --threads 2 --context 700 --out benchmarks/cpu/packed_linear.json

Each call verifies a chain of ``rows`` nodes after ``--context`` cached tokens (``tree_forward``,
logits of every row), and the cache is cut back after it. The table gives medians over ``--reps``
rounds as a ratio to the unpacked one-row call, and the largest logit difference between the
two variants (float summation order only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import dynatree.runtime.cache as C
from dynatree.bench.sysinfo import provenance
from dynatree.core.verify import tree_forward
from dynatree.loading.models import load_model
from verify_rows import chain  # (this folder: the same chain of verify nodes)

ROWS = (1, 2, 4, 8, 12, 16, 24)
VARIANTS = ("row-major", "packed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("--threads", 2), ("--context", 700), ("--reps", 15)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("packed_linear.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model("smollm2-135m")[0].eval()
    kv = C.CachedModel(target, C.vocab_size(target), cpu_linear=True)
    times: dict[tuple[str, int], list[float]] = {(v, n): [] for v in VARIANTS for n in ROWS}
    gap = 0.0
    with torch.inference_mode():
        kv.prefill([100 + (i * 7) % 5000 for i in range(args.context)])
        prefix = kv.length
        for rep in range(args.reps + 2):  # (the first two rounds warm up)
            for n in ROWS:
                logits = {}
                for v in VARIANTS:
                    kv.packed_linear = v == "packed"
                    t = time.perf_counter()
                    logits[v] = tree_forward(kv, chain(n), "bfs", lazy_head=False)[0]
                    if rep >= 2:
                        times[(v, n)].append(time.perf_counter() - t)
                    kv.compact(prefix, [])
                gap = max(gap, float((logits["packed"] - logits["row-major"]).abs().max()))
    one = statistics.median(times[("row-major", 1)])
    table = {v: {n: round(statistics.median(times[(v, n)]) / one, 3) for n in ROWS} for v in VARIANTS}
    record = {"threads": args.threads, "context": args.context, "reps": args.reps, **provenance(),
              "one_row_ms": round(one * 1e3, 2), "cost_in_one_row_steps": table, "max_logit_difference": gap}
    print(json.dumps(record, indent=1))
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
