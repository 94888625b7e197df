"""The back-off at a real model's size, on a pair whose speculation cannot pay: a Qwen2.5-1.5B-shaped
target and a Qwen2.5-0.5B-shaped draft, both with random weights (they never agree), fp32.

    python benchmarks/backoff/real_size.py [--prompts 3] [--max-new-tokens 64] [--out real_size.json]

On Spec-Bench first turns (the first question of each of ``--prompts`` tasks; the embedded target's
tokenizer, whose ids fit the shape's vocabulary), interleaved per prompt: our plain decoding, the
default (the draft model and the text in one tree) with the back-off, and the same without it
(``backoff=False``: every round drafts). Tokens per second pooled over the prompts (total tokens
over total time), and the default's ratio to plain decoding: the back-off's promise is that a run
whose speculation loses ends within about 3% of plain decoding (``loop/backoff.py``). Each run's time split is kept too (prefill, draft, verify; the first round
the draft model ran in includes its prompt's prefill, windowed by ``drafts.hybrid.prompt_window``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import dynatree
from dynatree import TextDraft
from dynatree.bench import specbench_questions as sq
from dynatree.bench.shapes import random_model
from dynatree.bench.sysinfo import provenance
from dynatree.catalog import DEFAULT_TARGET
from dynatree.loading.models import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer(DEFAULT_TARGET)
    target, draft = random_model("qwen2.5-1.5b", seed=0), random_model("qwen2.5-0.5b", seed=1)
    tasks = list(sq.by_task(sq.load_questions()).items())[: args.prompts]
    prompts = [sq._render(tok, [{"role": "user", "content": qs[0].turns[0]}]) for _, qs in tasks]
    stop = dynatree.StoppingConfig(eos_token_id=())  # (random weights: run every prompt to its length)
    runs = {"plain": lambda ids: dynatree.generate(target, None, ids, "autoregressive", max_new_tokens=args.max_new_tokens,
                                                   stopping=stop),
            "default": lambda ids: dynatree.generate(target, TextDraft(model=draft), ids, max_new_tokens=args.max_new_tokens,
                                                     stopping=stop),
            "default, no back-off": lambda ids: dynatree.generate(target, TextDraft(model=draft), ids, backoff=False,
                                                                  max_new_tokens=args.max_new_tokens, stopping=stop)}
    runs["plain"](prompts[0][:8])  # (warm-up: the few-row plan and the cost profiles are measured here)
    dynatree.generate(target, TextDraft(model=draft), prompts[0][:8], max_new_tokens=4, stopping=stop)
    totals = {k: [0, 0.0, 0] for k in runs}
    per_prompt: list[dict] = []
    outputs: dict[str, list[list[int]]] = {k: [] for k in runs}
    for ids in prompts:
        for name, run in runs.items():
            t0 = time.perf_counter()
            out = run(ids)
            totals[name][0] += out.stats.new_tokens
            totals[name][1] += time.perf_counter() - t0
            totals[name][2] += sum(r.drafted > 0 for r in out.stats.rounds)
            outputs[name].append(out.sequences[0].tolist())
            split = out.stats.summary()
            per_prompt.append({"prompt": len(outputs[name]) - 1, "prompt_tokens": len(ids), "run": name,
                               "seconds": time.perf_counter() - t0, "new_tokens": out.stats.new_tokens,
                               **{k: split[k] for k in ("t_prefill", "t_draft", "t_verify", "t_commit")},
                               "draft_first_round": next((r.t_draft for r in out.stats.rounds if r.draft_calls), 0.0)})
            print(f"{name:22s} {out.stats.new_tokens / (time.perf_counter() - t0):6.2f} tok/s "
                  f"({sum(r.drafted > 0 for r in out.stats.rounds)} of {out.stats.num_rounds} rounds drafted)", flush=True)
    same = all(outputs[k] == outputs["plain"] for k in runs)
    rate = {k: v[0] / v[1] for k, v in totals.items()}
    summary = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "threads": args.threads,
               "tok_per_s": rate, "over_plain": {k: rate[k] / rate["plain"] for k in runs},
               "drafted_rounds": {k: v[2] for k, v in totals.items()}, "outputs_equal": same, "runs": per_prompt,
               "date": time.strftime("%Y-%m-%d"), **provenance()}
    print(json.dumps({k: summary[k] for k in ("tok_per_s", "over_plain", "drafted_rounds", "outputs_equal")}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1, default=str)


if __name__ == "__main__":
    main()
