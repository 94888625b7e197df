"""Draft cost per drafted token as a share of one target step, both draft kinds, one process.

    python benchmarks/distill/draft_cost.py --feature DIR [--threads 1]

Times one-token cached calls exactly as the engine makes them (``CachedModel``; the feature draft
with its parent feature as an extra input), interleaved, medians over ``--reps`` calls after a
context of ``--context`` tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dynatree.loading import models
from dynatree.runtime.cache import CachedModel
from dynatree.drafts.checkpoint import load_distilled_draft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--feature", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = models.load_model("smollm2-135m")
    drafts = {"target": target, "independent": load_distilled_draft(target),
              "feature": load_distilled_draft(target, args.feature)}
    vocab = target.config.vocab_size
    kvs = {name: CachedModel(m, vocab, cpu_linear=True) for name, m in drafts.items()}
    ctx = list(range(1000, 1000 + args.context))
    times: dict[str, list[float]] = {name: [] for name in kvs}
    with torch.inference_mode():
        for kv in kvs.values():
            kv.prefill(ctx)
        for _ in range(args.reps):
            for name, kv in kvs.items():
                n = kv.length
                pos, vis = torch.tensor([n]), torch.ones(1, 1, dtype=torch.bool)
                t0 = time.perf_counter()
                if name == "feature":
                    kv.call([5], pos, vis, n, features=torch.zeros(1, 1, target.config.hidden_size))
                else:
                    kv.forward([5], pos, vis, n)
                times[name].append(time.perf_counter() - t0)
                kv.compact(n, [])
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    row = {"threads": args.threads, "context": args.context, "ms": ms,
           "share_of_target_step": {k: ms[k] / ms["target"] for k in ms if k != "target"}}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
