"""What ``torch.compile`` of the static engine costs on this CPU, first process vs a later one.

Run it twice: the first run fills inductor's on-disk cache (``/tmp/torchinductor_$USER`` unless
TORCHINDUCTOR_CACHE_DIR is set), the second one shows how much of the start-up that cache saves.
Appends one JSON row per run: seconds to build each model's graphs (bucket by bucket).

``--artifacts FILE``: torch's portable compile cache (``torch.compiler.save_cache_artifacts``):
loaded before compiling when FILE exists, else written after. With a fresh
TORCHINDUCTOR_CACHE_DIR this shows what a later process saves from that file alone (what a
library could ship in its own cache directory, keyed by model and machine), against inductor's
own on-disk cache.

Usage: PYTHONPATH=src python benchmarks/cpu/compile_cost.py --out benchmarks/cpu/compile_cost.jsonl
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--artifacts", help="torch.compiler cache artifacts: loaded when present, else saved")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    buckets = tuple(int(b) for b in args.buckets.split(","))
    target, _ = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{os.environ.get('USER', 'root')}"
    warm = os.path.isdir(cache) and any(os.scandir(cache))
    rec = {"machine": f"{platform.node()} {os.cpu_count()} cores", "threads": args.threads, "load": args.note,
           "torch": torch.__version__, "inductor_cache_had_entries": warm, "buckets": buckets, "seconds": {}}
    loaded = bool(args.artifacts) and os.path.isfile(args.artifacts)
    if loaded:
        t0 = time.perf_counter()
        with open(args.artifacts, "rb") as f:
            torch.compiler.load_cache_artifacts(f.read())
        rec["artifacts_loaded_s"] = round(time.perf_counter() - t0, 2)
        rec["artifacts_bytes"] = os.path.getsize(args.artifacts)
    for name, model in (("target", target), ("draft", draft)):
        static = resolve_options(EngineOptions(engine="static", compile=True, buckets=buckets), model).cache_options("cpu")
        with torch.inference_mode():
            t0 = time.perf_counter()
            kv = StaticCachedModel(model, vocab_size(target), 1024, compile=static.compile, compile_mode=static.compile_mode,
                                   buckets=static.buckets, cpu_linear=static.linear_plan or False)
            for b in buckets:
                kv.reset()
                kv.forward(torch.zeros(b, dtype=torch.long), torch.arange(b), torch.ones(b, b, dtype=torch.bool).tril(), 0)
                rec["seconds"][f"{name}-{b}"] = round(time.perf_counter() - t0, 1)
                print(name, b, rec["seconds"][f"{name}-{b}"], flush=True)
                t0 = time.perf_counter()
    rec["total_s"] = round(sum(rec["seconds"].values()), 1)
    if args.artifacts and not loaded:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            with open(args.artifacts, "wb") as f:
                f.write(saved[0])
            rec["artifacts_saved_bytes"] = len(saved[0])
    rec["time"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    print(json.dumps(rec))
    with open(args.out, "a") as f:
        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
