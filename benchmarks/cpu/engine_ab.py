"""Eager hf vs eager static engine in ONE process, interleaved (which engine should ``auto`` pick on
a CPU when it does not compile?). Autoregressive and DynaTree (3 nodes), offline pair, licence prompt.

Usage: PYTHONPATH=src python benchmarks/cpu/engine_ab.py --out benchmarks/cpu/engine_ab.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

import dynatree
from dynatree.loading import models
from dynatree.options import EngineOptions, StoppingConfig
from dynatree.cli.bench import _prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/cpu/engine_ab.jsonl")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", default="shared 2-core VM, other jobs running")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    ids = list(_prompts("licenses", tok, 1, 128, 0)[0].ids)
    configs = [(s, e) for s in ("autoregressive", "dynatree") for e in ("hf", "static")]
    got: dict = {c: [] for c in configs}
    for rep in range(-1, args.reps):
        for strat, eng in configs:
            opts = {"max_nodes": 3} if strat == "dynatree" else {}
            options = EngineOptions(engine=eng, compile=False,
                                    buckets=(1, 2, 4, 8, 16, 32) if eng == "static" else None)
            r = dynatree.generate(target, draft, ids, strat, max_new_tokens=args.tokens,
                                  stopping=StoppingConfig(eos_token_id=()), options=options, **opts)
            if rep >= 0:
                got[(strat, eng)].append(r.stats)
    with open(args.out, "a") as f:
        for (strat, eng), ss in got.items():
            rec = {"strategy": strat, "engine": eng, "tok_s": statistics.median(s.tokens_per_second for s in ss),
                   **{f"ms_{a}": statistics.median(1e3 * statistics.mean(getattr(x, f"t_{a}") for x in s.rounds) for s in ss)
                      for a in ("draft", "verify", "commit")},
                   "machine": f"{platform.node()} {os.cpu_count()} cores", "threads": args.threads, "load": args.note,
                   "tokens": args.tokens, "reps": args.reps, "time": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
            print(json.dumps(rec), flush=True)
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
