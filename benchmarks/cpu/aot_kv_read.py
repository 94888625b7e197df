"""What an aot package pays to read the KV cache: one step of the embedded target (1 and 8 rows)
at 128, 1,024 and 2,048 cache columns, exported three ways: with HF's per-query-head copy of the
cache (``repeat_kv``, what an exported step first did), reading shared KV heads in place through
SDPA's ``enable_gqa`` (its CPU flash kernel), and in place with the query heads of a KV head
stacked as rows of one product (``PackedGroupedAttention``, what packages do now). Packages are
built into a temporary folder (about 6 min on the 2-core EPYC); the variants run interleaved, 25
times each per size; min and median in ms.

    python benchmarks/cpu/aot_kv_read.py --out benchmarks/cpu/aot_kv_read.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time


#: (name, exported under grouped_kv, with PackedGroupedAttention)
VARIANTS = (("kv copied per query head", False, False), ("in place, SDPA enable_gqa", True, False),
            ("in place, packed rows per kv head", True, True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    from dynatree.bench.sysinfo import record_meta
    from dynatree.loading import models
    from dynatree.runtime import aot_engine as aot
    from dynatree.runtime.cache import few_row_plan, plain_head

    meta = record_meta(args.threads)  # (at the start: the code that runs)
    target, _ = models.load_model("smollm2-135m")
    plan, hidden = few_row_plan(target, torch.device("cpu"), True), plain_head(target)
    layers, heads, dim = aot.kv_shape(target)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in (1, 8):
            frozen = aot.package_layout(target, (rows,), plan)[1] is not None  # (8 rows: the dynamic package)
            runners = {}
            for i, (variant, grouped, packed) in enumerate(VARIANTS):
                path = os.path.join(tmp, f"{rows}-{i}.pt2")
                with contextlib.ExitStack() as stack:
                    for name in ("GROUPED_KV", "PackedGroupedAttention"):
                        stack.callback(setattr, aot, name, getattr(aot, name))
                    aot.GROUPED_KV = grouped
                    if not packed:
                        aot.PackedGroupedAttention = contextlib.nullcontext
                    aot.build_package(path, target, rows, hidden, plan, frozen)
                bound = aot._Bound(torch._inductor.aoti_load_package(path), frozen)
                bound.bind(target, hidden)
                runners[variant] = bound.runner
            for cols in (128, 1024, 2048):
                keys = [torch.randn(1, heads, cols, dim) for _ in range(layers)]
                values = [torch.randn(1, heads, cols, dim) for _ in range(layers)]
                length = cols - 100
                mask = torch.zeros(1, 1, rows, cols)
                mask[..., length + rows:] = torch.finfo(torch.float32).min
                call = (torch.randint(0, 1000, (1, rows)), mask, torch.arange(length, length + rows).view(1, -1),
                        torch.arange(length, length + rows), keys, values)
                times = {v: [] for v in runners}
                for rep in range(28):
                    for v, run in runners.items():
                        t = time.perf_counter()
                        run(*call)
                        if rep >= 3:
                            times[v].append((time.perf_counter() - t) * 1e3)
                for v, ts in times.items():
                    line = {"rows": rows, "frozen": frozen, "columns": cols, "variant": v,
                            "min_ms": round(min(ts), 2), "median_ms": round(statistics.median(ts), 2), "calls": len(ts)}
                    print(json.dumps(line), flush=True)
                    lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            for line in lines:
                f.write(json.dumps({**line, **meta}) + "\n")


if __name__ == "__main__":
    main()
