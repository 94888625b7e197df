"""Issue 14 on the offline pair, ONE process, configurations interleaved per prompt and repetition:

* the verify-cost profile the auto budget is chosen from (measured by ``dynatree.core.costmodel``);
* autoregressive, DynaTree with the fixed CPU budget of 3 nodes before and after the lean-round
  change (``LazyLogits.BATCH_ROWS`` 0 = one LM-head call per row read, the old behaviour; 4 = one
  call for the whole small tree), and DynaTree with the cost-model budget (``max_nodes`` unset);
* per-round split (ms: draft / verify / commit), tok/s, L, nodes per round, greedy check vs AR.

Usage: PYTHONPATH=src python benchmarks/cpu/fast_default.py --engine static --out benchmarks/cpu/fast_default.jsonl
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
from dynatree.policies import make_policy
from dynatree.core.verify import LazyLogits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="static")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", default="benchmarks/cpu/fast_default.jsonl")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", default="busy shared 2-core VM (load average 7-10 from other jobs)")
    args = ap.parse_args()
    os.environ["DYNATREE_COST_MODEL"] = "on"  # the measured budget is opt-in
    torch.set_num_threads(args.threads)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    prompts = _prompts("licenses", tok, args.prompts, 128, 0)
    eng = EngineOptions(engine=args.engine, compile=args.compile,
                        buckets=(1, 2, 4, 8, 16, 32) if args.engine == "static" else None)
    no_eos = StoppingConfig(eos_token_id=())
    if args.compile:
        t0 = time.perf_counter()
        dynatree.precompile(target, draft, 128 + args.tokens, buckets=eng.buckets)
        print(f"precompile {time.perf_counter() - t0:.1f} s", flush=True)
    configs = [("ar", "autoregressive", {}, 4), ("dynatree-3-before", "dynatree", {"max_nodes": 3}, 0),
               ("dynatree-3", "dynatree", {"max_nodes": 3}, 4), ("dynatree-auto", "dynatree", {}, 4)]
    t0 = time.perf_counter()
    profile_policy = make_policy("dynatree")
    ids = list(prompts[0].ids)
    dynatree.generate(target, draft, ids, profile_policy, max_new_tokens=8, stopping=no_eos, options=eng)
    t_profile = time.perf_counter() - t0
    profile = profile_policy.cost_profile
    print("profile", profile, f"({t_profile:.1f} s incl. an 8-token run)", flush=True)
    rows: dict[str, list] = {c[0]: [] for c in configs}
    for rep in range(-1, args.reps):  # rep -1: warm-up, not recorded
        for p in prompts:
            ref = None
            for label, strat, opts, batch in configs:
                LazyLogits.BATCH_ROWS = batch
                policy = make_policy(strat, **opts)
                if strat == "dynatree" and not opts:
                    policy.use_cost_model(profile)
                r = dynatree.generate(target, draft, list(p.ids), policy, max_new_tokens=args.tokens,
                                      stopping=no_eos, options=eng)
                out = r.sequences[0].tolist()
                ref = out if ref is None else ref
                if rep >= 0:
                    rows[label].append((r.stats, out == ref))
    LazyLogits.BATCH_ROWS = 4
    meta = {"machine": f"{platform.node()} {os.cpu_count()} cores", "threads": args.threads, "load": args.note,
            "engine": args.engine, "compile": args.compile, "tokens": args.tokens, "prompts": args.prompts,
            "reps": args.reps, "dataset": "licenses", "torch": torch.__version__,
            "time": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    ar_tps = statistics.median(s.tokens_per_second for s, _ in rows["ar"])
    with open(args.out, "a") as f:
        f.write(json.dumps({"kind": "cost_profile", "rows": profile.rows, "ms": profile.ms, "stepwise": profile.stepwise,
                            "seconds_to_measure": t_profile, **meta}) + "\n")
        for label, strat, opts, batch in configs:
            ss = [s for s, _ in rows[label]]
            per = lambda a: statistics.median(1e3 * statistics.mean(getattr(x, a) for x in s.rounds) for s in ss)
            budget = [x.policy_state["budget"] for s in ss for x in s.rounds if "budget" in x.policy_state]
            rec = {"kind": "run", "label": label, "strategy": strat, **opts, "head_batch_rows": batch,
                   "ms_draft": per("t_draft"), "ms_verify": per("t_verify"), "ms_commit": per("t_commit"),
                   "tok_s": statistics.median(s.tokens_per_second for s in ss),
                   "x_ar": statistics.median(s.tokens_per_second for s in ss) / ar_tps,
                   "L": statistics.median(s.mean_committed for s in ss),
                   "nodes": statistics.mean(x.drafted for s in ss for x in s.rounds),
                   "budget": statistics.mean(budget) if budget else None,
                   "greedy_match": all(m for _, m in rows[label]), **meta}
            print(json.dumps(rec), flush=True)
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
