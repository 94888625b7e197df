"""What ``torch.compile`` of the static engine costs on this CPU, first process vs a later one.

Run it twice: the first run fills inductor's on-disk cache (``/tmp/torchinductor_$USER`` unless
TORCHINDUCTOR_CACHE_DIR is set), the second one shows how much of the start-up that cache saves.
Appends one JSON row per run: seconds to build each model's graphs (bucket by bucket).

Usage: PYTHONPATH=src python benchmarks/cpu/compile_cost.py --out benchmarks/cpu/compile_cost.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time

import torch

from dynatree.runtime.engines import resolve as resolve_options

from dynatree.loading import models
from dynatree.runtime.cache import StaticCachedModel
from dynatree.runtime.engines import CPU_AUTO_BUCKETS
from dynatree.loading.models import vocab_size
from dynatree.options import EngineOptions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/cpu/compile_cost.jsonl")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--buckets", default=",".join(map(str, CPU_AUTO_BUCKETS)))
    ap.add_argument("--note", default="busy shared 2-core VM (load average 7-10 from other jobs)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    buckets = tuple(int(b) for b in args.buckets.split(","))
    target, _ = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{os.environ.get('USER', 'root')}"
    warm = os.path.isdir(cache) and any(os.scandir(cache))
    rec = {"machine": f"{platform.node()} {os.cpu_count()} cores", "threads": args.threads, "load": args.note,
           "torch": torch.__version__, "inductor_cache_had_entries": warm, "buckets": buckets, "seconds": {}}
    for name, model in (("target", target), ("draft", draft)):
        static = resolve_options(EngineOptions(engine="static", compile=True, buckets=buckets), model).cache_options("cpu")
        with torch.inference_mode():
            t0 = time.perf_counter()
            kv = StaticCachedModel(model, vocab_size(target), 1024, **dataclasses.asdict(static))
            for b in buckets:
                kv.reset()
                kv.forward(torch.zeros(b, dtype=torch.long), torch.arange(b), torch.ones(b, b, dtype=torch.bool).tril(), 0)
                rec["seconds"][f"{name}-{b}"] = round(time.perf_counter() - t0, 1)
                print(name, b, rec["seconds"][f"{name}-{b}"], flush=True)
                t0 = time.perf_counter()
    rec["total_s"] = round(sum(rec["seconds"].values()), 1)
    rec["time"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    print(json.dumps(rec))
    with open(args.out, "a") as f:
        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
