"""Side-by-side cost of the two layouts of a few-row linear layer on this CPU (one process, interleaved).

Every weight matrix of SmolLM2-135M's decoder (30 layers x q, k, v, o, gate, up, down; random
values of the real shapes, 420 MB fp32, far larger than the caches) is multiplied by M rows:

* ``F.linear``   -- ``x @ W.T``, what ``nn.Linear`` does;
* ``(W @ x.T).T`` -- :func:`dynatree.runtime.kernels.cpu_linear.small_batch_linear` (one row padded to two);

``--matrices head`` times the LM head instead (49152 x 576, 113 MB fp32: the head the lazy-logits
path applies to the rows acceptance reads) and records, per row count, whether ``(W @ x.T).T``
gives each row bitwise the result it gets in the one-row (padded-to-two) call: the autoregressive
step's rounding. Eager, and with ``--compiled`` also under ``torch.compile`` (14 more graphs: ~10 minutes of
compilation on the 2-core VM). Cases are interleaved round by round so a drifting VM hits them
alike; the median of ``--reps`` rounds is reported. Writes JSON next to this file.

    python benchmarks/cpu/linear_layout.py --threads 2 [--compiled] --out benchmarks/cpu/linear_layout.json
    python benchmarks/cpu/linear_layout.py --threads 1 --matrices head --out benchmarks/cpu/head_layout_1thread.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dynatree.runtime.kernels.cpu_linear import small_batch_linear

H, INTER, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152


def weights(matrices: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    decoder = [(H, H), (KV, H), (KV, H), (H, H), (INTER, H), (INTER, H), (H, INTER)] * LAYERS
    shapes = decoder if matrices == "decoder" else [(VOCAB, H)]
    return [torch.randn(*s, generator=g) * 0.02 for s in shapes]


def stack(ws: list[torch.Tensor], xh: torch.Tensor, xi: torch.Tensor, layout: str) -> torch.Tensor:
    acc = xh.new_zeros(())
    for w in ws:
        x = xh if w.shape[1] == H else xi
        y = F.linear(x, w) if layout == "F.linear" else small_batch_linear(x, w)
        acc = acc + y.sum()
    return acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--compiled", action="store_true", help="also time torch.compile'd versions")
    ap.add_argument("--matrices", choices=("decoder", "head"), default="decoder",
                    help="the 210 decoder matrices, or the LM head alone")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("linear_layout.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    ws = weights(args.matrices)
    fns = {}
    for layout in ("F.linear", "(W @ x.T).T"):
        fns[("eager", layout)] = lambda a, b, layout=layout: stack(ws, a, b, layout)
        if args.compiled:
            fns[("compiled", layout)] = torch.compile(lambda a, b, layout=layout: stack(ws, a, b, layout),
                                                      dynamic=False)
    torch._dynamo.config.recompile_limit = 64
    cases = [(mode, layout, m) for (mode, layout) in fns for m in rows]
    xs = {m: (torch.randn(m, H), torch.randn(m, INTER)) for m in rows}
    times: dict[tuple, list[float]] = {c: [] for c in cases}
    with torch.inference_mode():
        for mode, layout, m in cases:  # compile / warm every case first
            fns[(mode, layout)](*xs[m])
        for _ in range(args.reps):
            for c in cases:
                t = time.perf_counter()
                fns[c[:2]](*xs[c[2]])
                times[c].append(time.perf_counter() - t)
    result = {
        "machine": f"{platform.processor() or platform.machine()}; {args.threads} torch threads",
        "torch": torch.__version__,
        "what": ("ms per pass over all 210 decoder weight matrices of SmolLM2-135M (fp32), median"
                 if args.matrices == "decoder" else "ms per LM-head call (49152 x 576, fp32), median"),
        "ms": [{"mode": mode, "layout": layout, "rows": m,
                "median_ms": round(sorted(times[(mode, layout, m)])[args.reps // 2] * 1e3, 2)}
               for mode, layout, m in cases],
    }
    if args.matrices == "head":
        result["bitwise_as_one_row"] = row_stability(ws[0], rows)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for r in result["ms"]:
        print(f"{r['mode']:8s} {r['layout']:12s} rows={r['rows']:3d} {r['median_ms']:7.1f} ms")
    for r in result.get("bitwise_as_one_row", []):
        print(f"rows={r['rows']:3d} (W @ x.T).T rows bitwise as in a one-row call: {r['equal']}; "
              f"max |diff| to F.linear {r['max_abs_diff_to_F.linear']:.2g}")


def row_stability(w: torch.Tensor, rows: list[int]) -> list[dict]:
    """Per row count: does every row of a batched ``(W @ x.T).T`` equal that row's one-row call?"""
    x = torch.randn(max(rows), w.shape[1], generator=torch.Generator().manual_seed(1))
    alone = [small_batch_linear(x[i : i + 1], w)[0] for i in range(len(x))]
    out = []
    for m in rows:
        batch = small_batch_linear(x[:m], w)
        out.append({"rows": m, "equal": all(torch.equal(batch[i], alone[i]) for i in range(m)),
                    "max_abs_diff_to_F.linear": float((batch - F.linear(x[:m], w)).abs().max())})
    return out


if __name__ == "__main__":
    main()
