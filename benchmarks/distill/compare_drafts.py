"""Distilled drafts side by side in ONE process on the offline target: tokens per round,
acceptance and speed over autoregressive, interleaved per prompt, greedy output checked.

    python benchmarks/distill/compare_drafts.py --new /work/distill-run/final --out compare.jsonl
    python benchmarks/distill/compare_drafts.py --new feature=/work/feat-run/final \
        --strategies linear,fixed,dynatree,dyspec --out compare_kinds.jsonl

The old draft is the one shipped in the package unless ``--old DIR`` says otherwise; ``--new``
takes ``DIR`` or a comma-separated list of ``NAME=DIR``. Prompts are the held-out documents of the
offline corpora (``wiki-offline``, ``books-offline``) and ``pydoc``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

import dynatree
from dynatree.loading import models
from dynatree.bench.datasets import load_prompt_ids
from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.options import EngineOptions, StoppingConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", required=True)
    ap.add_argument("--strategies", default="linear,dynatree")
    ap.add_argument("--old", type=Path, default=None)
    ap.add_argument("--datasets", default="wiki-offline,books-offline,pydoc")
    ap.add_argument("--prompts", type=int, default=2, help="per dataset")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = models.load_model("smollm2-135m")
    drafts = {"old": load_distilled_draft(target, args.old)}
    for item in args.new.split(","):
        name, _, folder = item.rpartition("=")
        drafts[name or "new"] = load_distilled_draft(target, Path(folder))
    prompts = [(name, ids) for name in args.datasets.split(",")
               for ids in load_prompt_ids(name, tok, args.prompts, 128, seed=0)]
    configs = [("ar", "autoregressive", None, {})]
    options = {"linear": {"k": 4}}
    for d in drafts:
        configs += [(f"{st}{'4' if st == 'linear' else ''}-{d}", st, d, options.get(st, {}))
                    for st in args.strategies.split(",")]
    rows = []
    dynatree.generate(target, drafts["old"], prompts[0][1], "dynatree", max_new_tokens=8)  # warm-up
    for dataset, ids in prompts:
        ref = None
        for label, strategy, d, opts in configs:
            out = dynatree.generate(target, drafts.get(d), ids, strategy, max_new_tokens=args.tokens,
                                    stopping=StoppingConfig(eos_token_id=()), options=EngineOptions(engine="hf"),
                                    **opts)
            s = out.stats
            ref = out.sequences if ref is None else ref
            row = {"dataset": dataset, "label": label, "tok_s": s.tokens_per_second, "mean_L": s.mean_committed,
                   "acceptance": s.acceptance, "greedy_match": bool(torch.equal(out.sequences, ref))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    print("\n| config | mean L (tokens/round) | acceptance | speed vs AR (same prompt, same run) | greedy match |")
    print("|---|---|---|---|---|")
    for label, *_ in configs:
        sub = [r for r in rows if r["label"] == label]
        ratios = []
        for i, r in enumerate(rows):
            if r["label"] == label:
                ar_row = next(x for x in reversed(rows[: i + 1]) if x["label"] == "ar")
                ratios.append(r["tok_s"] / ar_row["tok_s"])
        print(f"| {label} | {statistics.mean(r['mean_L'] for r in sub):.2f} | "
              f"{statistics.mean(r['acceptance'] for r in sub):.1%} | {statistics.median(ratios):.2f}x | "
              f"{sum(r['greedy_match'] for r in sub)}/{len(sub)} |")


if __name__ == "__main__":
    main()
