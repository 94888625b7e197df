"""What the aot engine's package of dynamic rows saves: trees run unpadded, prompts compiled.

Two records, on the embedded target's own packages (built into the user cache first if missing):

- ``step``: one verify step of ``rows`` rows at 300 cached tokens (384 cache columns), run by the
  package of dynamic rows at its own row count, and at the row count the frozen buckets before it
  padded it to (4, 8, 16): the same package at the same sizes took the time of the bucket's own
  package and gave the same outputs, bit for bit. 25 interleaved calls each after 3 warm-ups;
  min and median in ms, final hidden states only (the head is applied apart).
- ``prefill``: each Spec-Bench first-turn prompt (2 questions per task) cached by the engine's
  prefill as it runs now (chunks of up to 256 rows through the package of dynamic rows) and as it
  ran before (chunks of more rows than the largest bucket eagerly, oneDNN on the weights in
  place); 3 interleaved passes, the fastest kept (noise only adds time).

    python benchmarks/cpu/aot_dynamic_rows.py --out benchmarks/cpu/aot_dynamic_rows.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

#: tree sizes timed, and the bucket the frozen packages per bucket (4, 8, 16) padded each to
ROWS = (3, 4, 5, 6, 7, 8, 10, 12, 16)
OLD_BUCKETS = (4, 8, 16)
CACHED, COLUMNS = 300, 384


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    from dynatree.bench.sysinfo import record_meta
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.loading import models
    from dynatree.options import EngineOptions
    from dynatree.runtime.cache import vocab_size
    from dynatree.runtime.engines import cached_model, resolve

    meta = record_meta(args.threads)  # (at the start: the code that runs)
    target, tok = models.load_model("smollm2-135m")
    options = resolve(EngineOptions(engine="aot"), target)
    kv = cached_model(target, vocab_size(target), "aot", 4096, options.cache_options("cpu"))
    low = kv._dynamic_from
    if low is None:
        raise SystemExit("this machine's plan builds no package of dynamic rows (no packed weights): nothing to time")
    run = kv._packages[low].runner
    lines = []

    gen = torch.Generator().manual_seed(0)
    cache = [torch.randn(1, *kv._kv_shape[1:2], COLUMNS, kv._kv_shape[2], generator=gen) for _ in range(2 * kv._kv_shape[0])]
    keys, values = cache[: kv._kv_shape[0]], cache[kv._kv_shape[0]:]

    def call(width: int) -> tuple:
        allowed = torch.zeros(width, COLUMNS, dtype=torch.bool)
        allowed[:, :CACHED] = True
        allowed[:, CACHED : CACHED + width] = torch.ones(width, width, dtype=torch.bool).tril()
        mask = torch.zeros(width, COLUMNS).masked_fill_(~allowed, torch.finfo(torch.float32).min)
        return (torch.randint(0, 1000, (1, width), generator=gen), mask.view(1, 1, width, COLUMNS),
                torch.arange(CACHED, CACHED + width).view(1, -1), torch.arange(CACHED, CACHED + width))

    for rows in ROWS:
        padded = next(b for b in OLD_BUCKETS if b >= rows)
        calls = {"unpadded": call(rows), "padded": call(padded)}
        times: dict[str, list[float]] = {k: [] for k in calls}
        for rep in range(28):
            for k, c in calls.items():
                t = time.perf_counter()
                run(*c, keys, values)
                if rep >= 3:
                    times[k].append((time.perf_counter() - t) * 1e3)
        line = {"record": "step", "rows": rows, "padded_to": padded, "cached": CACHED, "columns": COLUMNS,
                **{f"{k}_{s}_ms": round(f(v), 2) for k, v in times.items() for s, f in (("min", min), ("median", statistics.median))}}
        print(json.dumps(line), flush=True)
        lines.append(line)

    prompts = specbench_prompts("spec-bench", tok, 2, 2048, first_turns=True)
    best: dict[str, dict[str, float]] = {}
    for rep in range(3):
        for pid, ids in prompts:
            for way in (("dynamic", "eager") if rep % 2 == 0 else ("eager", "dynamic")):
                kv.reset()
                kv._dynamic_from = low if way == "dynamic" else None  # (None: the eager chunks of before)
                t = time.perf_counter()
                kv.prefill(list(ids[:-1]))
                best.setdefault(pid, {})[way] = min(best.get(pid, {}).get(way, float("inf")), time.perf_counter() - t)
    kv._dynamic_from = low
    for pid, ids in prompts:
        line = {"record": "prefill", "prompt": pid, "tokens": len(ids) - 1,
                **{f"{w}_ms": round(1e3 * s, 1) for w, s in best[pid].items()}}
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            for line in lines:
                f.write(json.dumps({**line, **meta}) + "\n")


if __name__ == "__main__":
    main()
