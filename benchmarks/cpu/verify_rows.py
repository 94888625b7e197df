"""What one verify pass of the embedded target costs against its number of rows, on this CPU, for
three variants of the engine's CPU path, interleaved in one process.

* ``before``    -- the few-row linear layout returning its transposed (column-major) view, and HF's
  SDPA path copying the KV cache once per query head (``repeat_kv``) for every multi-row call:
  the engine up to session 12;
* ``row-major`` -- the layout's result copied to row-major order (``kernels/cpu_linear.py``);
* ``in place``  -- that, and multi-row calls reading the grouped KV cache in place
  (``kernels/grouped_kv.py``): the engine's default now.

The target is SmolLM2-135M-Instruct (9 query heads on 3 KV heads), fp32, with ``--context`` cached
tokens. Each call verifies a chain of ``rows`` nodes (``tree_forward`` with the lazy head, as
decoding does), and the cache is cut back after it. Each case runs once per round, and the rounds
are interleaved so that a drifting VM hits all cases alike. The table gives the median over
``--reps`` rounds, as a ratio to the one-row call of ``before``.

    python benchmarks/cpu/verify_rows.py --threads 2 --context 700 --out benchmarks/cpu/verify_rows.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import dynatree.runtime.cache as cache_mod
from dynatree.core.tree import TreeBuilder
from dynatree.core.verify import tree_forward
from dynatree.loading.models import load_model
from dynatree.runtime.kernels import cpu_linear, grouped_kv

ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24)
ROW_MAJOR = cpu_linear.small_batch_linear
VARIANTS = ("before", "row-major", "in place")


def transposed_layout(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      packed: bool = False) -> torch.Tensor:
    """The layout as it was: the same values, returned as the transposed view of ``W @ x.T``
    (never packed: the variants here predate packed weights)."""
    rows = x.numel() // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = torch.cat((flat, flat))
    out = torch.mm(weight, flat.t()).t()[:rows]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def use(variant: str) -> None:
    cpu_linear.small_batch_linear = ROW_MAJOR if variant != "before" else transposed_layout
    cache_mod.grouped_kv_applies = grouped_kv.applies if variant == "in place" else (lambda device, rows: False)


def chain(rows: int) -> object:
    b = TreeBuilder(5)
    p = 0
    for i in range(rows - 1):
        p = b.add(p, 300 + i, 0.0)
    return b.freeze()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=700)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("verify_rows.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model("smollm2-135m")[0].eval()
    kv = cache_mod.CachedModel(target, cache_mod.vocab_size(target), cpu_linear=True)
    times: dict[tuple[str, int], list[float]] = {(v, n): [] for v in VARIANTS for n in ROWS}
    with torch.inference_mode():
        kv.prefill([100 + (i * 7) % 5000 for i in range(args.context)])
        prefix = kv.length
        for rep in range(args.reps + 2):  # (the first two rounds warm up)
            for n in ROWS:
                for v in VARIANTS:
                    use(v)
                    t = time.perf_counter()
                    tree_forward(kv, chain(n), "bfs", lazy_head=True)
                    if rep >= 2:
                        times[(v, n)].append(time.perf_counter() - t)
                    kv.compact(prefix, [])
    use("in place")
    one = statistics.median(times[("before", 1)])
    table = {v: {n: round(statistics.median(times[(v, n)]) / one, 3) for n in ROWS} for v in VARIANTS}
    record = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "torch": torch.__version__, "context": args.context, "reps": args.reps,
              "one_row_ms": round(one * 1e3, 2), "ratio_to_one_row_before": table}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.context} cached tokens, {args.threads} threads; one-row step (before) {one * 1e3:.1f} ms")
    print("| rows | " + " | ".join(map(str, ROWS)) + " |")
    print("|---|" + "---|" * len(ROWS))
    for v in VARIANTS:
        print(f"| {v} | " + " | ".join(f"{table[v][n]:.2f}x" for n in ROWS) + " |")


if __name__ == "__main__":
    main()
