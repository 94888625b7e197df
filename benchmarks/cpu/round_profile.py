"""Per-round cost split (draft / verify / commit) and a cProfile of the round loop, offline pair.

Usage: PYTHONPATH=src python benchmarks/cpu/round_profile.py --label before --out benchmarks/cpu/round_split.jsonl
Runs DynaTree (pinned budget) and autoregressive on the eager hf engine and the uncompiled static
engine, interleaved, and appends one JSON row per (label, strategy, engine) with median ms/round.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import statistics
import time

import torch

import dynatree
from dynatree.loading import models
from dynatree.options import EngineOptions, StoppingConfig

NO_EOS = StoppingConfig(eos_token_id=())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", default="benchmarks/cpu/round_split.jsonl")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engines", default="hf,static")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--max-nodes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    text = ("The GNU General Public License is a free, copyleft license for software and other kinds of works. "
            "The licenses for most software and other practical works are designed to take away your freedom")
    ids = tok(text, return_tensors="pt").input_ids
    configs = []
    for eng in args.engines.split(","):
        extra = {"engine": eng, "compile": bool(args.compile and eng == "static")}  # EngineOptions fields
        configs.append(("autoregressive", {}, extra))
        configs.append(("dynatree", {"max_nodes": args.max_nodes}, extra))
    for name, opts, extra in configs:  # warm-up (and compile)
        dynatree.generate(target, draft, ids, name, max_new_tokens=16, stopping=NO_EOS, options=EngineOptions(**extra),
                          **opts)
    samples: dict[int, list] = {i: [] for i in range(len(configs))}
    outs = {}
    for _ in range(args.reps):
        for i, (name, opts, extra) in enumerate(configs):
            r = dynatree.generate(target, draft, ids, name, max_new_tokens=args.tokens, stopping=NO_EOS,
                                  options=EngineOptions(**extra), **opts)
            samples[i].append(r.stats)
            outs.setdefault(i, r.sequences[0].tolist())
    ref = outs[0]
    with open(args.out, "a") as f:
        for i, (name, opts, extra) in enumerate(configs):
            rows = [s.rounds for s in samples[i]]
            med = lambda attr: statistics.median(1e3 * statistics.mean(getattr(r, attr) for r in rs) for rs in rows)
            rec = {"label": args.label, "strategy": name, **opts, **extra, "tokens": args.tokens, "reps": args.reps,
                   "ms_draft": med("t_draft"), "ms_verify": med("t_verify"), "ms_commit": med("t_commit"),
                   "tok_s": statistics.median(s.tokens_per_second for s in samples[i]),
                   "L": statistics.median(s.mean_committed for s in samples[i]),
                   "greedy_match": outs[i] == ref, "machine": platform.node(), "threads": args.threads,
                   "load": "busy (shared 2-core VM, other jobs running)", "time": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
            print(json.dumps(rec))
            f.write(json.dumps(rec) + "\n")
    if args.profile:
        name, opts, extra = configs[-1]
        pr = cProfile.Profile()
        pr.enable()
        dynatree.generate(target, draft, ids, name, max_new_tokens=args.tokens, stopping=NO_EOS,
                          options=EngineOptions(**extra), **opts)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
        print(s.getvalue())


if __name__ == "__main__":
    main()
