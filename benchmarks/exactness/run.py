"""Greedy exactness of the embedded pair, measured over long runs rather than asserted.

The unit tests prove exactness on tiny random models; this script measures it on the real pair
the CLI runs by default (SmolLM2-135M-Instruct target, shipped distilled draft, default engine
options) over the bench's offline prompt sets. Every speculative strategy's greedy output is
compared token for token with our autoregressive output of the same prompt (same engine, same
linear layout), and that autoregressive output with HuggingFace's own
``target.generate(do_sample=False)`` (plain ``nn.Linear``, HF's cache): the first comparison
catches a tree-verify logit that differs from a one-token step's enough to flip an argmax, the
second one whether our few-row linear layout alone moves the autoregressive output.

Prompt sets: ``pydoc`` and ``licenses`` (raw continuation, never stopping early, so every run
generates exactly ``--max-new-tokens``), and ``chat`` (a pydoc or licence passage inside the
tokenizer's chat template with an instruction, stopping at the end of the reply as ``dynatree
generate --chat`` does).

One JSON line per (set, prompt, strategy) is appended as soon as the run finishes; a rerun skips
the lines already written (keyed by set, prompt token hash, strategy, token budget, thread count
and linear layout), so an interrupted run continues where it stopped. ``--summary`` prints the
per-(set, strategy) table of benchmarks/exactness/README.md from the results file, ``--margins``
how close the autoregressive outputs came to a tie (the target's top-2 logit margins).

    PYTHONPATH=src nice -n 10 python benchmarks/exactness/run.py            # resumable
    PYTHONPATH=src python benchmarks/exactness/run.py --summary
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "greedy_match.jsonl"
SETS = ("pydoc", "licenses", "chat")
STRATEGIES = ("linear", "fixed", "dynatree", "dyspec", "dyspec-threshold")
AR, HF = "autoregressive", "hf-generate"
# The DySpec strategies' default trees are large (up to 64 and 768 nodes): on a 2-core CPU a round
# of dyspec-threshold costs tens of seconds, so they run on the first prompts of each set only.
LIMITS = {"dyspec": 4, "dyspec-threshold": 1}


def first_mismatch(reference: list[int], output: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts); None if identical."""
    for i, (a, b) in enumerate(zip(reference, output)):
        if a != b:
            return i
    return None if len(reference) == len(output) else min(len(reference), len(output))


def build_prompts(name: str, tok: Any, target: Any, count: int, max_prompt_tokens: int
                  ) -> list[tuple[str, list[int], list[int]]]:
    """(prompt id, token ids, EOS ids) for a set. Raw sets never stop early (``[]``): every run
    then yields the full token budget. Chat prompts stop at the end of the reply."""
    from dynatree.bench.datasets import load_prompt_ids, load_prompts
    from dynatree.integrations.chat import chat_eos, chat_prompt
    from dynatree.training.data import CHAT_INSTRUCTIONS

    if name != "chat":
        ids = load_prompt_ids(name, tok, count, max_prompt_tokens)
        return [(f"{name}:{i}", list(p[:max_prompt_tokens]), []) for i, p in enumerate(ids)]
    # Passages from both offline sets (another seed than the raw sets, so other passages),
    # alternating, each under one of the distillation's chat instructions in turn.
    half = (count + 1) // 2
    texts = [t for pair in zip(load_prompts("pydoc", tok, half, max_prompt_tokens, seed=1),
                               load_prompts("licenses", tok, half, max_prompt_tokens, seed=1)) for t in pair]
    eos = chat_eos(target, tok)
    return [(f"chat:{i}", chat_prompt(tok, [{"role": "user", "content": f"{CHAT_INSTRUCTIONS[i % len(CHAT_INSTRUCTIONS)]}"
                                                                     f"\n\n{text}"}]), eos)
            for i, text in enumerate(texts[:count])]


def sha(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


def key(row: dict[str, Any]) -> str:
    return "|".join(str(row[k]) for k in ("set", "prompt_sha", "strategy", "max_new_tokens", "threads", "cpu_linear"))


def load_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_hf(target: Any, ids: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
    """HF's own greedy ``generate``. ``eos=[]`` (never stop) is passed as an id outside the
    vocabulary: HF falls back to the model's EOS when given none."""
    import torch

    stop = eos or [int(target.config.vocab_size) + 1]
    with torch.inference_mode():
        out = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0,
                              eos_token_id=stop, pad_token_id=stop[0])
    return out[0, len(ids):].tolist()


def measure(args: argparse.Namespace) -> None:
    import torch
    from tqdm import tqdm

    import dynatree
    from dynatree.loading import models
    from dynatree.options import EngineOptions, StoppingConfig
    from dynatree.runtime.engines import resolve as resolve_options

    if args.threads:
        torch.set_num_threads(args.threads)
    target, tok = models.load_model(models.DEFAULT_TARGET)
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    # The CLI's defaults (engine auto, cpu_linear and lazy_head decided for this machine), unless
    # --cpu-linear pins the layout (e.g. on with 1 thread, where the default would turn it off).
    options = resolve_options(EngineOptions(cpu_linear=args.cpu_linear), target)
    common = {"threads": torch.get_num_threads(), "cpu_linear": bool(options.cpu_linear),
              "engine": options.engine, "compile": bool(options.compile), "max_new_tokens": args.max_new_tokens}
    meta = {"machine": f"{platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} cores",
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "note": args.note}
    done = {key(r): r for r in load_rows(args.out)}
    plan: list[tuple[dict[str, Any], list[int]]] = []
    prompts = {name: build_prompts(name, tok, target, args.prompts, args.max_prompt_tokens) for name in args.sets}
    # Prompts round-robin over the sets, so an interrupted run has covered every set evenly; a
    # strategy with a limit runs on the first prompts of each set only.
    for i in range(args.prompts):
        for name in args.sets:
            pid, ids, eos = prompts[name][i]
            for strategy in (AR, *((HF,) if args.hf else ()), *STRATEGIES):
                if i >= args.limit.get(strategy, args.prompts):
                    continue
                plan.append(({"set": name, "prompt": pid, "prompt_sha": sha(ids), "prompt_tokens": len(ids),
                              "eos": eos, "strategy": strategy, **common}, ids))
    todo = sum(1 for row, _ in plan if key(row) not in done)
    print(f"{len(plan)} runs planned, {len(plan) - todo} already in {args.out}; {common}", file=sys.stderr, flush=True)
    outputs: dict[tuple[str, str], list[int]] = {}  # (prompt sha, strategy) -> generated ids
    with args.out.open("a") as out, tqdm(total=todo, unit="run", dynamic_ncols=True) as bar:
        for row, ids in plan:
            k = key(row)
            if k in done:
                outputs[(row["prompt_sha"], row["strategy"])] = done[k]["output_ids"]
                continue
            bar.set_description(f"{row['prompt']} {row['strategy']}")
            start = time.perf_counter()
            stats: dict[str, Any] = {}
            if row["strategy"] == HF:
                new = run_hf(target, ids, args.max_new_tokens, row["eos"])
            else:
                result = dynatree.generate(target, draft, ids, row["strategy"], max_new_tokens=args.max_new_tokens,
                                           stopping=StoppingConfig(eos_token_id=row["eos"]), seed=0, options=options)
                new = result.sequences[0, len(ids):].tolist()
                stats = {"rounds": result.stats.num_rounds, "mean_committed": result.stats.mean_committed}
            seconds = time.perf_counter() - start
            outputs[(row["prompt_sha"], row["strategy"])] = new
            ar, hf = outputs.get((row["prompt_sha"], AR)), outputs.get((row["prompt_sha"], HF))
            row.update({
                "tokens": len(new), "output_ids": new, "seconds": round(seconds, 2), **stats,
                # AR's own row compares with nothing (it is the reference); HF's with our AR
                "first_mismatch_vs_ar": None if row["strategy"] == AR else first_mismatch(ar, new),
                "checked_vs_hf": hf is not None and row["strategy"] != HF,
                "first_mismatch_vs_hf": first_mismatch(hf, new) if hf is not None and row["strategy"] != HF else None,
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **meta,
            })
            out.write(json.dumps(row) + "\n")
            out.flush()
            bar.update()
            if row["first_mismatch_vs_ar"] is not None:
                bar.write(f"MISMATCH {row['prompt']} {row['strategy']} vs AR at token {row['first_mismatch_vs_ar']}")


def margins(args: argparse.Namespace) -> None:
    """How close the autoregressive runs came to a tie: the target's top-2 logit margin at every
    generated position (one forward over prompt + output), against the tree-vs-one-token logit
    differences of ``bitwise.jsonl`` (~5e-5 on this model). A flip needs a margin that small."""
    import torch

    from dynatree.loading import models

    target, tok = models.load_model(models.DEFAULT_TARGET)
    rows = [r for r in load_rows(args.out) if r["strategy"] == AR]
    ids_by_sha = {sha(ids): ids for name in args.sets
                  for _, ids, _ in build_prompts(name, tok, target, args.prompts, args.max_prompt_tokens)}
    found = []
    with torch.inference_mode():
        for r in rows:
            prompt = ids_by_sha[r["prompt_sha"]]
            full = torch.tensor([prompt + r["output_ids"]])
            logits = target(full).logits[0, len(prompt) - 1 : full.shape[1] - 1]
            top2 = logits.topk(2, dim=-1).values
            found += (top2[:, 0] - top2[:, 1]).tolist()
    m = torch.tensor(found)
    print(f"{m.numel()} positions of {len(rows)} autoregressive runs: smallest top-2 margin {float(m.min()):.3g}; "
          + ", ".join(f"{int((m < t).sum())} below {t:g}" for t in (1e-4, 1e-3, 1e-2, 1e-1)))


def summary(rows: list[dict[str, Any]]) -> str:
    """Markdown table per (set, strategy): sequences, tokens, sequences differing from our AR
    output and from HF generate, and the first differing positions."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["set"], r["strategy"])].append(r)
    order = {s: i for i, s in enumerate((AR, HF, *STRATEGIES))}
    lines = ["| set | strategy | sequences | tokens | ≠ our AR | first differing token | ≠ HF generate | first differing token |",
             "|---|---|---:|---:|---:|---|---:|---|"]
    totals = defaultdict(int)
    for (name, strategy), rs in sorted(groups.items(), key=lambda kv: (SETS.index(kv[0][0]), order[kv[0][1]])):
        vs_ar = [r["first_mismatch_vs_ar"] for r in rs if r["first_mismatch_vs_ar"] is not None]
        vs_hf = [r["first_mismatch_vs_hf"] for r in rs if r["first_mismatch_vs_hf"] is not None]
        checked_hf = sum(1 for r in rs if r.get("checked_vs_hf"))
        tokens = sum(r["tokens"] for r in rs)
        lines.append(f"| {name} | {strategy} | {len(rs)} | {tokens} | "
                     f"{'—' if strategy == AR else f'{len(vs_ar)}/{len(rs)}'} | {', '.join(map(str, vs_ar)) or '—'} | "
                     f"{f'{len(vs_hf)}/{checked_hf}' if checked_hf else '—'} | {', '.join(map(str, vs_hf)) or '—'} |")
        if strategy in STRATEGIES:
            totals["tokens"] += tokens
            totals["sequences"] += len(rs)
            totals["vs_ar"] += len(vs_ar)
            totals["vs_hf"] += len(vs_hf)
    lines.append(f"| **all** | speculative | {totals['sequences']} | {totals['tokens']} | {totals['vs_ar']} | | "
                 f"{totals['vs_hf']} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--prompts", type=int, default=10, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-prompt-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, as the CLI)")
    ap.add_argument("--cpu-linear", type=lambda s: {"on": True, "off": False}[s], default=None,
                    help="on | off; default: the engine's rule (on from 2 threads)")
    ap.add_argument("--limit", action="append", default=[], metavar="STRATEGY=N",
                    help="run STRATEGY on the first N prompts of each set only (repeatable); default: "
                         + ", ".join(f"{k}={v}" for k, v in LIMITS.items()))
    ap.add_argument("--no-hf", dest="hf", action="store_false", help="skip HF generate")
    ap.add_argument("--note", default="")
    ap.add_argument("--summary", action="store_true", help="print the table from --out and exit")
    ap.add_argument("--margins", action="store_true",
                    help="print the target's smallest top-2 margins along the autoregressive outputs in --out")
    args = ap.parse_args()
    args.limit = {**LIMITS, **{k: int(v) for k, v in (x.split("=", 1) for x in args.limit)}}
    if args.summary:
        print(summary(load_rows(args.out)))
    elif args.margins:
        margins(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
