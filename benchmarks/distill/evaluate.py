"""Held-out agreement and CPU cost of the distilled draft vs. the target and early-exit drafts.

    python benchmarks/distill/evaluate.py [--draft DIR] [--data RUN/data.pt] --out results.json

Agreement is teacher-forced on the target's greedy continuations of held-out prompts (documents
never used in training): exact for greedy speculation, where the draft only ever sees the
target's own text. Costs: median wall time of one cached forward (prefix of 128 tokens) for the
draft and the target, interleaved in one process at the same thread count; ratios are what count.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import DynamicCache

from dynatree.training.distill import evaluate
from dynatree.training.config import DistillConfig
from dynatree.training.data import LabelledData, build_prompts, label_prompts, offline_corpus
from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.loading.models import load_model, make_early_exit_draft


@torch.inference_mode()
def forward_ms(models: dict[str, torch.nn.Module], n_tokens: dict[str, int], prefix: int = 128,
               reps: int = 40) -> dict[str, float]:
    """Median ms of one cached forward of ``n_tokens[name]`` tokens, calls interleaved."""
    caches, times = {}, {name: [] for name in n_tokens}
    ids = torch.randint(1000, 20000, (1, prefix + 8))
    for name, model in models.items():
        caches[name] = DynamicCache(config=model.config)
        model(input_ids=ids[:, :prefix], past_key_values=caches[name], use_cache=True)
    for _ in range(reps):
        for key, n in n_tokens.items():
            name = key.split("@")[0]
            t = time.perf_counter()
            models[name](input_ids=ids[:, prefix:prefix + n], past_key_values=caches[name],
                         position_ids=torch.arange(prefix, prefix + n)[None], use_cache=True)
            times[key].append(time.perf_counter() - t)
            caches[name].crop(-n)
    return {k: 1000 * statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", type=Path, default=None, help="draft folder (default: shipped)")
    ap.add_argument("--data", type=Path, default=None, help="data.pt of a distill run (eval split)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--early-exit", type=int, nargs="*", default=[2, 4, 8, 16])
    args = ap.parse_args()
    torch.manual_seed(0)
    target, tok = load_model("smollm2-135m")
    cfg = DistillConfig()
    if args.data is not None:
        evals = LabelledData(**torch.load(args.data, weights_only=True)["eval"])
    else:
        torch.set_num_threads(2)
        prompts = build_prompts(tok, offline_corpus(), cfg)
        evals = label_prompts(target, prompts.eval, prompts.eval_chat, cfg, tok.eos_token_id,
                              desc="target labels (held-out)")
    draft = load_distilled_draft(target, args.draft)
    result: dict = {"machine": f"{platform.processor() or platform.machine()}, "
                               f"{torch.get_num_threads()} torch threads max, {platform.platform()}",
                    "eval_sequences": len(evals), "agreement": {}, "cost_ms": {}}
    drafts = {"distilled": draft} | {f"early-exit:{k}": make_early_exit_draft(target, k)
                                     for k in args.early_exit}
    torch.set_num_threads(2)
    for name, model in drafts.items():
        result["agreement"][name] = asdict(evaluate(model, evals))
        print(name, result["agreement"][name], flush=True)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        models = {"target": target, "distilled": draft, "early-exit:4": drafts["early-exit:4"]}
        ms = forward_ms(models, {"target": 1, "target@5": 5, "distilled": 1, "distilled@8": 8,
                                 "early-exit:4": 1})
        result["cost_ms"][f"threads={threads}"] = ms
        print(threads, ms, flush=True)
    # linear K=4 estimate: per round K draft calls + one target call over K+1 tokens
    ms = result["cost_ms"]["threads=2"]
    tokens = result["agreement"]["distilled"]["linear_k4_tokens"]
    result["linear_k4_estimated_speedup_threads2"] = (
        tokens * ms["target"] / (4 * ms["distilled"] + ms["target@5"]))
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
